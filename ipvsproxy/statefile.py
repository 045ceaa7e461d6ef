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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipvsproxy.identity import ServiceIdentity, identities_from_json, identities_to_json
from ipvsproxy.model import DestKey, Protocol, ServiceKey

VERSION = 1
_PLACEHOLDER = "\0virtual servers\0"  # where the virtual servers' text goes


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
    """The state as a snapshot and a journal of changes since it, so that a sync writes in
    proportion to what it changed.

    An endpoint change alters one Service's identity (or one draining entry); rewriting the
    whole document for it cost ~400 ms at 10,000 Services on the host, and writing the 4 MB
    of 5,000 Services took 150-170 ms in the lab kernel, a hundred times the change's kernel
    work. So ``save`` appends one line, the difference from what was last written, to
    ``<path>.journal``; ``load`` replays the journal over the snapshot. When the journal has
    grown as large as the snapshot (or a change is that large), the snapshot is rewritten
    (atomically) and the journal emptied. A line torn by a crash while it was appended is the
    last one: it is ignored, and the next save rewrites the snapshot.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal = path.with_name(path.name + ".journal")
        self._saved: _Saved | None = None
        self._snapshot_bytes = 0
        self._journal_bytes = 0
        self._torn = False

    def load(self) -> State:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return State()
        except OSError as exc:
            raise ValueError(f"state file {self.path} is unreadable: {exc}") from exc
        try:
            state = State.from_json(json.loads(text))
            lines = self._journal_lines()
            for line in lines:
                _replay(state, line)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"state file {self.path} is unreadable: {exc}") from exc
        self._snapshot_bytes = len(text)
        self._journal_bytes = sum(len(line) + 1 for line in lines)
        self._saved = _Saved.of(state)
        return state

    def _journal_lines(self) -> list[str]:
        try:
            text = self.journal.read_text()
        except FileNotFoundError:
            return []
        lines = text.split("\n")
        if lines[-1]:  # no newline after the last line: torn by a crash while appended
            self._torn = True
        return [line for line in lines[:-1] if line]

    def save(self, state: State) -> bool:
        """Write if anything changed; return whether it wrote."""
        if self._saved is not None and not self._torn:
            change = self._saved.change(state)
            if change is None:
                return False
            line = json.dumps(change)
            if self._journal_bytes + len(line) < max(self._snapshot_bytes, JOURNAL_MIN_BYTES):
                with self.journal.open("a") as f:
                    f.write(line + "\n")
                self._journal_bytes += len(line) + 1
                self._saved.absorb(state, change)
                return True
        self._write_snapshot(state)
        return True

    def _write_snapshot(self, state: State) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".state-")
        size = 0
        with os.fdopen(fd, "w") as f:
            for chunk in self.render(state):
                f.write(chunk)
                size += len(chunk)
        os.replace(tmp, self.path)  # the new snapshot holds every change journalled so far
        self.journal.unlink(missing_ok=True)
        self._snapshot_bytes, self._journal_bytes, self._torn = size, 0, False
        self._saved = _Saved.of(state)

    def render(self, state: State) -> Iterator[str]:
        """``json.dumps(state.to_json())`` in pieces, a Service at a time, written as they
        come: the snapshot is rewritten rarely (at the first sync, then when the journal has
        grown as large), so nothing of it is kept between writes; at 10,000 Services a cache of
        the pieces was 8.5 MiB, and the joined text a few more at the first sync's peak."""
        head = json.dumps(state.head_json(_PLACEHOLDER))
        before, _, after = head.partition(json.dumps(_PLACEHOLDER))
        yield before
        yield from _servers_text(state.virtual_servers)
        yield after[:-1] + ', "identities": {'
        for i, service in enumerate(sorted(state.identities)):
            ident = state.identities[service].to_json()
            yield (", " if i else "") + json.dumps(service) + ": " + json.dumps(ident)
        yield "}}"


def _servers_text(virtual_servers: set[ServiceKey] | frozenset[ServiceKey]) -> Iterator[str]:
    """``json.dumps(servers_json(...))`` a thousand at a time: as one list, the keys' lists and
    their text were ~5 MiB at 10,000 Services, at the first sync's peak. (ServiceKeys sort as
    their lists do: the protocol is a str enum.)"""
    ordered = sorted(virtual_servers)
    yield "["
    for i in range(0, len(ordered), SERVERS_PER_PIECE):
        piece = [[k.address, k.protocol.value, k.port] for k in ordered[i : i + SERVERS_PER_PIECE]]
        yield (", " if i else "") + json.dumps(piece)[1:-1]
    yield "]"


SERVERS_PER_PIECE = 1000
JOURNAL_MIN_BYTES = 64 * 1024  # a small snapshot still gets a journal this long


def _key_json(k: ServiceKey) -> list[Any]:
    return [k.address, k.protocol.value, k.port]


def _key(data: list[Any]) -> ServiceKey:
    a, p, port = data
    return ServiceKey(str(a), Protocol(p), int(port))


def _replay(state: State, change: str) -> None:
    """Apply one journal line (see ``_Saved.change``) to ``state``."""
    c = json.loads(change)
    state.virtual_servers.difference_update(_key(k) for k in c.get("vs-", []))
    state.virtual_servers.update(_key(k) for k in c.get("vs+", []))
    for a, p, port, da, dp, t in c.get("draining", []):
        entry = (ServiceKey(a, Protocol(p), int(port)), DestKey(da, int(dp)))
        if t is None:
            state.draining_since.pop(entry, None)
        else:
            state.draining_since[entry] = float(t)
    if "rules" in c:
        state.rules_digest, state.iptables_fingerprint = (str(x) for x in c["rules"])
    for service, ident in c.get("identities", {}).items():
        if ident is None:
            state.identities.pop(service, None)
        else:
            state.identities[service] = ServiceIdentity.from_json(service, ident)


@dataclass
class _Saved:
    """What was last written, to tell cheaply whether and how a state differs from it."""

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

    def absorb(self, state: State, change: dict[str, Any]) -> None:
        """Become ``state`` once ``change`` (from ``change``) is written, copying only what it
        names: copying every identity and virtual server after each endpoint change was most
        of the change's host time at 10,000 Services."""
        if "vs+" in change:
            self.virtual_servers = frozenset(state.virtual_servers)
        if "draining" in change:
            self.draining_since = dict(state.draining_since)
        self.rules_digest, self.iptables_fingerprint = (
            state.rules_digest,
            state.iptables_fingerprint,
        )
        for service in change.get("identities", {}):
            ident = state.identities.get(service)
            if ident is None:
                self.identities.pop(service, None)
            else:
                self.identities[service] = ident

    def change(self, state: State) -> dict[str, Any] | None:
        """A journal line's content turning what was saved into ``state``; None: the same."""
        out: dict[str, Any] = {}
        if self.virtual_servers != state.virtual_servers:
            out["vs-"] = [
                _key_json(k) for k in sorted(self.virtual_servers - state.virtual_servers)
            ]
            out["vs+"] = [
                _key_json(k) for k in sorted(state.virtual_servers - self.virtual_servers)
            ]
        if self.draining_since != state.draining_since:
            now, was = state.draining_since, self.draining_since
            out["draining"] = [
                [*_key_json(s), d.address, d.port, now.get((s, d))]
                for s, d in sorted(now.keys() | was.keys())
                if now.get((s, d)) != was.get((s, d))
            ]
        rules = (state.rules_digest, state.iptables_fingerprint)
        if rules != (self.rules_digest, self.iptables_fingerprint):
            out["rules"] = list(rules)
        identities: dict[str, Any] = {}
        saved = self.identities
        for service, ident in state.identities.items():
            old = saved.get(service)
            if old is not ident:
                if old != ident:
                    identities[service] = ident.to_json()
                else:  # a replan's equal copy: remember it, so the next look is an `is`
                    saved[service] = ident
        if len(saved) + len(identities) != len(state.identities):
            identities.update({s: None for s in saved.keys() - state.identities.keys()})
        if identities:
            out["identities"] = identities
        return out or None
