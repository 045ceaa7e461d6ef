"""A small file on the node that remembers what ipvsproxy owns across restarts.

The kernel tells most of it (addresses on kube-ipvs0 are ours), but not which virtual servers
on node addresses (NodePorts) ipvsproxy created, nor since when a real server has been
draining, nor the fingerprint of the iptables chains it last wrote. Process memory alone would
forget all of that on a restart, and a restart must neither delete foreign state nor rewrite
ours.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipvsproxy.identity import ServiceIdentity, identities_from_json, identities_to_json
from ipvsproxy.model import DestKey, Protocol, ServiceKey

VERSION = 1


@dataclass
class State:
    virtual_servers: set[ServiceKey] = field(default_factory=set)
    draining_since: dict[tuple[ServiceKey, DestKey], float] = field(default_factory=dict)
    rules_digest: str = ""
    iptables_fingerprint: str = ""
    # What each programmed Service's virtual and real servers stand for, so that
    # `ipvsproxy status` can name them while the daemon is not running.
    identities: dict[str, ServiceIdentity] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "virtualServers": sorted(
                [k.address, k.protocol.value, k.port] for k in self.virtual_servers
            ),
            "drainingSince": sorted(
                [s.address, s.protocol.value, s.port, d.address, d.port, t]
                for (s, d), t in self.draining_since.items()
            ),
            "rulesDigest": self.rules_digest,
            "iptablesFingerprint": self.iptables_fingerprint,
            "identities": identities_to_json(self.identities),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> State:
        if data.get("version") != VERSION:
            raise ValueError(f"unsupported state file version {data.get('version')!r}")
        return cls(
            virtual_servers={
                ServiceKey(a, Protocol(p), int(port)) for a, p, port in data["virtualServers"]
            },
            draining_since={
                (ServiceKey(a, Protocol(p), int(port)), DestKey(da, int(dp))): float(t)
                for a, p, port, da, dp, t in data.get("drainingSince", [])
            },
            rules_digest=str(data.get("rulesDigest", "")),
            iptables_fingerprint=str(data.get("iptablesFingerprint", "")),
            identities=identities_from_json(data.get("identities", {})),
        )


class StateFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._written: dict[str, Any] | None = None

    def load(self) -> State:
        try:
            state = State.from_json(json.loads(self.path.read_text()))
        except FileNotFoundError:
            return State()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"state file {self.path} is unreadable: {exc}") from exc
        self._written = state.to_json()
        return state

    def save(self, state: State) -> bool:
        """Write if anything changed (atomically); return whether it wrote."""
        data = state.to_json()
        if data == self._written:
            return False
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".state-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, self.path)
        self._written = data
        return True
