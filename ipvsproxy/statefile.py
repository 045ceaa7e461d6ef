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
_PLACEHOLDER = "\0virtual servers\0"  # where the cached virtual servers' text goes


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
            **self.head_json(servers_json(self.virtual_servers)),
            "identities": identities_to_json(self.identities),
        }

    def head_json(self, virtual_servers: Any) -> dict[str, Any]:
        """The document's keys before its identities, in order, with ``virtual_servers``."""
        return {
            "version": VERSION,
            "virtualServers": virtual_servers,
            "drainingSince": sorted(
                [s.address, s.protocol.value, s.port, d.address, d.port, t]
                for (s, d), t in self.draining_since.items()
            ),
            "rulesDigest": self.rules_digest,
            "iptablesFingerprint": self.iptables_fingerprint,
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


def servers_json(virtual_servers: set[ServiceKey] | frozenset[ServiceKey]) -> list[list[Any]]:
    return sorted([k.address, k.protocol.value, k.port] for k in virtual_servers)


class StateFile:
    """Writes the state when it changed, in time proportional to what changed.

    An endpoint change alters one Service's identity; re-serialising and comparing the whole
    document for it took ~400 ms at 10,000 Services, more than the change's kernel work. So
    each Service's identity is serialised once per identity object (a replan makes a new one;
    an untouched Service keeps its object) and the document is joined from those pieces.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._saved: _Saved | None = None
        self._pieces: dict[str, tuple[ServiceIdentity, str]] = {}
        self._servers: tuple[frozenset[ServiceKey], str] = (frozenset(), "[]")

    def load(self) -> State:
        try:
            state = State.from_json(json.loads(self.path.read_text()))
        except FileNotFoundError:
            return State()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"state file {self.path} is unreadable: {exc}") from exc
        self._saved = _Saved.of(state)
        return state

    def save(self, state: State) -> bool:
        """Write if anything changed (atomically); return whether it wrote."""
        if self._saved is not None and self._saved.same(state):
            return False
        text = self.render(state)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".state-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, self.path)
        self._saved = _Saved.of(state)
        return True

    def render(self, state: State) -> str:
        """``json.dumps(state.to_json())``, joined from cached pieces."""
        if self._servers[0] != state.virtual_servers:
            servers = frozenset(state.virtual_servers)
            self._servers = (servers, json.dumps(servers_json(servers)))
        pieces = {}
        for service, ident in state.identities.items():
            cached = self._pieces.get(service)
            if cached is None or cached[0] is not ident:
                cached = (ident, json.dumps(service) + ": " + json.dumps(ident.to_json()))
            pieces[service] = cached
        self._pieces = pieces
        head = json.dumps(state.head_json(_PLACEHOLDER))
        head = head.replace(json.dumps(_PLACEHOLDER), self._servers[1], 1)[:-1]
        body = ", ".join(text for _, (_, text) in sorted(pieces.items()))
        return head + ', "identities": {' + body + "}}"


@dataclass
class _Saved:
    """What was last written, to tell cheaply whether a state differs from it."""

    virtual_servers: frozenset[ServiceKey]
    draining_since: dict[tuple[ServiceKey, DestKey], float]
    rules_digest: str
    iptables_fingerprint: str
    identities: dict[str, ServiceIdentity]

    @classmethod
    def of(cls, state: State) -> _Saved:
        return cls(
            frozenset(state.virtual_servers),
            dict(state.draining_since),
            state.rules_digest,
            state.iptables_fingerprint,
            dict(state.identities),
        )

    def same(self, state: State) -> bool:
        if (
            self.rules_digest != state.rules_digest
            or self.iptables_fingerprint != state.iptables_fingerprint
            or self.draining_since != state.draining_since
            or self.virtual_servers != state.virtual_servers
            or len(self.identities) != len(state.identities)
        ):
            return False
        saved = self.identities
        # A replan makes a new identity object: compare by value only those (few) that are new.
        return all(
            (old := saved.get(k)) is ident or old == ident for k, ident in state.identities.items()
        )
