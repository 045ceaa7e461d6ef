"""A small file on the node that remembers what ipvsproxy owns across restarts.

The kernel tells most of it (addresses on kube-ipvs0 are ours), but not which virtual servers
on node addresses (NodePorts) ipvsproxy created, nor since when a real server has been
draining, nor the fingerprint of the iptables chains it last wrote. Process memory alone would
forget all of that on a restart, and a restart must neither delete foreign state nor rewrite
ours.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipvsproxy.core.identities import ServiceIdentity, identities_from_json, identities_to_json
from ipvsproxy.core.virtual_servers import DestKey, Protocol, ServiceKey
from ipvsproxy.dataplane.tracked import TrackedDict, TrackedSet

VERSION = 1
_PLACEHOLDER = "\0virtual servers\0"  # where the virtual servers' text goes


@dataclass
class State:
    """What ipvsproxy owns on the node that the kernel does not tell, as the file keeps it.

    - ``virtual_servers``: the virtual servers that are ipvsproxy's (the NodePorts on node
      addresses among them, which nothing in the kernel marks as ours), each recorded before
      the kernel is asked to create it and dropped once deleted; a full sync trims them to
      what the kernel holds;
    - ``draining_since``: when each real server being drained at weight 0 started draining
      (the dataplane's clock, wall time), so that a restart keeps its grace period;
    - ``rules_digest`` and ``iptables_fingerprint``: the digest of the rules text last written
      and the fingerprint of our chains as read right after ("" when unknown), so that a
      restart rewrites the rules only when either differs (or a jump is missing);
    - ``identities``: each programmed Service's names, for ``ipvsproxy status``.
    ``virtual_servers`` and ``identities`` note the keys changed since the last save
    (``TrackedSet``, ``TrackedDict``), so a save compares those only: its cost follows the
    change, not the cluster. ``to_json`` and ``from_json`` are the file's format (``VERSION``), and
    ``from_json`` raises ValueError (or KeyError, TypeError) on a document it cannot read."""

    virtual_servers: set[ServiceKey] = field(default_factory=set)
    draining_since: dict[tuple[ServiceKey, DestKey], float] = field(default_factory=dict)
    rules_digest: str = ""
    iptables_fingerprint: str = ""
    # What each programmed Service's virtual and real servers stand for, so that
    # `ipvsproxy status` can name them while the daemon is not running.
    identities: dict[str, ServiceIdentity] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Tracked, so that a save compares only what changed since the last one.
        self.virtual_servers = TrackedSet(self.virtual_servers)
        self.identities = TrackedDict(self.identities)

    def saved(self) -> None:
        """Forget which keys changed: what they hold now is what the file holds."""
        for tracked in (self.virtual_servers, self.identities):
            if isinstance(tracked, (TrackedSet, TrackedDict)):
                tracked.touched.clear()

    def to_json(self, generation: str = "") -> dict[str, Any]:
        return {
            **self.head_json(servers_json(self.virtual_servers), generation),
            "identities": identities_to_json(self.identities),
        }

    def head_json(self, virtual_servers: Any, generation: str = "") -> dict[str, Any]:
        """The document's keys before its identities, in order, with ``virtual_servers``."""
        return {
            "version": VERSION,
            "generation": generation,
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
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
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
    proportion to what it changed, never to the size of the cluster.

    An endpoint change alters one Service's identity (or one draining entry), while the
    document names every Service. So ``save`` appends one line, the difference from what was
    last written, to ``<path>.journal``; ``load`` replays the journal over the snapshot. When
    the journal has grown as large as the snapshot (or a change is that large), the snapshot
    is rewritten and the journal emptied. One process writes (the holder of ``StateLock``,
    through ``open``); others may ``load`` at any time.

    Crash safety, as invariants:
    - the snapshot is replaced whole: written to ``.<name>.tmp`` (one fixed name, so crashes
      leave at most one, removed by the next ``open``), fsynced, renamed over, the directory
      fsynced; every journal line is fsynced before ``save`` returns;
    - each snapshot has a random ``generation`` and each journal line names the generation it
      follows: lines of an older snapshot (a crash between the rename and the journal's
      removal) are never replayed over a newer one;
    - a line torn by a crash while it was appended is the last one: it is ignored, and the
      next save rewrites the snapshot;
    - a file that cannot be read (empty, truncated, corrupt, a newer version) loads as what
      could be read and ``unreadable`` says why: the caller falls back to the kernel;
    - a failed write raises OSError and leaves the next ``save`` to write a whole snapshot.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.journal = path.with_name(path.name + ".journal")
        self.tmp = path.with_name(f".{path.name}.tmp")
        self.unreadable: str | None = None  # why the last load could not read everything
        self._saved: _Saved | None = None
        self._generation = ""
        self._snapshot_bytes = 0
        self._journal_bytes = 0
        self._torn = False

    def open(self) -> State:
        """``load`` for the one writer (it holds the ``StateLock``): first remove the
        snapshot a crash left half written. (Readers such as ``ipvsproxy status`` must not:
        it may be the running daemon's.)"""
        self.tmp.unlink(missing_ok=True)
        return self.load()

    def load(self) -> State:
        self.unreadable, self._saved = None, None
        try:
            data = json.loads(self.path.read_bytes())
            state = State.from_json(data)
            generation = str(data.get("generation", ""))
        except FileNotFoundError:
            return State()
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self.unreadable = f"state file {self.path} is unreadable: {exc}"
            return State()
        self._generation = generation
        self._snapshot_bytes = self.path.stat().st_size
        self._journal_bytes = 0
        for line in self._journal_lines():
            self._journal_bytes += len(line) + 1
            try:
                _replay(state, line, generation)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                self.unreadable = f"state file journal {self.journal} is unreadable: {exc}"
                self._torn = True  # the next save rewrites the snapshot without it
                break
        self._saved = _Saved.of(state)
        state.saved()
        return state

    def _journal_lines(self) -> list[str]:
        try:
            text = self.journal.read_bytes().decode(errors="replace")
        except FileNotFoundError:
            return []
        except OSError as exc:
            self.unreadable = f"state file journal {self.journal} is unreadable: {exc}"
            self._torn = True
            return []
        lines = text.split("\n")
        if lines[-1]:  # no newline after the last line: torn by a crash while appended
            self._torn = True
        return [line for line in lines[:-1] if line]

    def save(self, state: State) -> bool:
        """Write if anything changed; return whether it wrote. Raises OSError when the write
        failed (disk full, read-only): then the next save writes a whole snapshot."""
        if self._saved is not None and not self._torn:
            change = self._saved.change(state)
            if change is None:
                state.saved()
                return False
            line = json.dumps({"gen": self._generation, **change})
            if self._journal_bytes + len(line) < max(self._snapshot_bytes, JOURNAL_MIN_BYTES):
                self._append(line)
                self._saved.absorb(state, change)
                state.saved()
                return True
        self._write_snapshot(state)
        return True

    def _append(self, line: str) -> None:
        new = self._journal_bytes == 0
        self._torn = True  # until the line is whole on disk
        fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            _fsync_dir(self.journal.parent)
        self._journal_bytes += len(line) + 1
        self._torn = False

    def _write_snapshot(self, state: State) -> None:
        self._saved = None  # until the new snapshot is in place
        self.path.parent.mkdir(parents=True, exist_ok=True)
        generation = secrets.token_hex(8)
        fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                for chunk in self.render(state, generation):
                    f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
                size = f.tell()
            os.replace(self.tmp, self.path)
        except Exception:
            self.tmp.unlink(missing_ok=True)
            raise
        _fsync_dir(self.path.parent)
        # The journal's lines name the old generation: a crash before this leaves them unread.
        self.journal.unlink(missing_ok=True)
        self._generation, self._snapshot_bytes, self._journal_bytes = generation, size, 0
        self._torn = False
        self._saved = _Saved.of(state)
        state.saved()

    def render(self, state: State, generation: str = "") -> Iterator[str]:
        """``json.dumps(state.to_json())`` in pieces (``SERVICES_PER_PIECE`` Services each),
        written as they come: the snapshot is rewritten rarely (at the first sync, then when the
        journal has grown as large), so nothing of it is kept between writes, and no more than a
        piece of its text is held at a time."""
        head = json.dumps(state.head_json(_PLACEHOLDER, generation))
        before, _, after = head.partition(json.dumps(_PLACEHOLDER))
        yield before
        yield from _servers_text(state.virtual_servers)
        yield after[:-1] + ', "identities": {'
        services = sorted(state.identities)
        for i in range(0, len(services), SERVICES_PER_PIECE):
            piece = {s: state.identities[s].to_json() for s in services[i : i + SERVICES_PER_PIECE]}
            yield (", " if i else "") + json.dumps(piece)[1:-1]
        yield "}}"


def _servers_text(virtual_servers: set[ServiceKey] | frozenset[ServiceKey]) -> Iterator[str]:
    """``json.dumps(servers_json(...))`` a thousand at a time, so that the keys' lists and
    their text are never all held at once (the first sync's peak is when they are written).
    (ServiceKeys sort as their lists do: the protocol is a str enum.)"""
    ordered = sorted(virtual_servers)
    yield "["
    for i in range(0, len(ordered), SERVERS_PER_PIECE):
        piece = [[k.address, k.protocol.value, k.port] for k in ordered[i : i + SERVERS_PER_PIECE]]
        yield (", " if i else "") + json.dumps(piece)[1:-1]
    yield "]"


SERVERS_PER_PIECE = 1000
SERVICES_PER_PIECE = 100  # identities encoded at a time (one json.dumps each)
JOURNAL_MIN_BYTES = 64 * 1024  # a small snapshot still gets a journal this long


def _key_json(k: ServiceKey) -> list[Any]:
    return [k.address, k.protocol.value, k.port]


def _key(data: list[Any]) -> ServiceKey:
    a, p, port = data
    return ServiceKey(str(a), Protocol(p), int(port))


def _replay(state: State, change: str, generation: str) -> None:
    """Apply one journal line (see ``_Saved.change``) to ``state``, if it follows the
    snapshot of ``generation`` (lines written before the 1st generation name none)."""
    c = json.loads(change)
    if c.get("gen", "") != generation:
        return
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

    virtual_servers: set[ServiceKey]
    draining_since: dict[tuple[ServiceKey, DestKey], float]
    rules_digest: str
    iptables_fingerprint: str
    identities: dict[str, ServiceIdentity]

    @classmethod
    def of(cls, state: State) -> _Saved:
        return cls(
            set(state.virtual_servers),
            dict(state.draining_since),
            state.rules_digest,
            state.iptables_fingerprint,
            dict(state.identities),
        )

    def absorb(self, state: State, change: dict[str, Any]) -> None:
        """Become ``state`` once ``change`` (from ``change``) is written, copying only what it
        names, so that a save costs in proportion to the change, not to the cluster."""
        if "vs+" in change:
            self.virtual_servers.difference_update(_key(k) for k in change["vs-"])
            self.virtual_servers.update(_key(k) for k in change["vs+"])
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
        ours, saved_vs = state.virtual_servers, self.virtual_servers
        # Only the virtual servers and identities touched since the last save can differ
        # (State tracks them); an untracked state is compared whole.
        vs_keys = ours.touched if isinstance(ours, TrackedSet) else ours | saved_vs
        gone = sorted(k for k in vs_keys if k in saved_vs and k not in ours)
        new = sorted(k for k in vs_keys if k in ours and k not in saved_vs)
        if gone or new:
            out["vs-"] = [_key_json(k) for k in gone]
            out["vs+"] = [_key_json(k) for k in new]
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
        saved, named = self.identities, state.identities
        services = named.touched if isinstance(named, TrackedDict) else named.keys() | saved.keys()
        for service in services:
            ident, old = named.get(service), saved.get(service)
            if ident is None:
                if service in saved:
                    identities[service] = None
            elif old is not ident:
                if old != ident:
                    identities[service] = ident.to_json()
                else:  # a replan's equal copy: remember it, so the next look is an `is`
                    saved[service] = ident
        if identities:
            out["identities"] = identities
        return out or None


def _fsync_dir(path: Path) -> None:
    """Make a rename or a new file in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StateLocked(Exception):
    """Another ipvsproxy holds the state file's lock."""


@dataclass
class StateLock:
    """An exclusive ``flock`` on ``<state file>.lock``, held for the process's life: two
    instances on one node (a DaemonSet update with maxSurge, or ``cleanup`` beside the
    daemon) must not program the node nor write the state file at once. The lock file holds
    its holder's pid, for the message; it is never removed (removing it would let a third
    instance lock a new file while the second holds the old one)."""

    path: Path
    fd: int

    @classmethod
    def acquire(
        cls,
        state_path: Path,
        wait: bool,
        on_wait: Callable[[str], None] | None = None,
    ) -> StateLock:
        """Lock; if another process holds it: ``wait`` for it (``on_wait`` is told once
        why), or raise StateLocked naming it."""
        path = state_path.with_name(state_path.name + ".lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                why = f"another ipvsproxy (pid {holder}) holds {path}"
                if not wait:
                    raise StateLocked(why) from None
                if on_wait is not None:
                    on_wait(f"{why}: waiting for it to exit")
                fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    def release(self) -> None:
        os.close(self.fd)  # closing the only descriptor releases the flock
