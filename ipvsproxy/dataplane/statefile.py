"""A small file on the node that remembers what ipvsproxy owns across restarts.

The kernel tells most of it (addresses on kube-ipvs0 are ours), but not which virtual servers
on node addresses (NodePorts) ipvsproxy created, nor since when a real server has been
draining, nor the fingerprint of the iptables chains it last wrote. Process memory alone would
forget all of that on a restart, and a restart must neither delete foreign state nor rewrite
ours.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import re
import secrets
import shutil
import socket
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ipvsproxy.core.identities import ServiceIdentity, identities_to_json
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
    def from_json(cls, data: dict[str, Any], problems: Problems) -> State:
        """The state ``data`` holds, each entry read on its own: one that cannot be read (a
        wrong type, a number out of range, an address that is none) is left out and said in
        ``problems``, the others are kept. Raises ValueError on a document that is not one
        of this version."""
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        if data.get("version") != VERSION:
            raise ValueError(f"unsupported state file version {data.get('version')!r:.40}")
        virtual_servers = set(_each("virtualServers", data.get("virtualServers"), _key, problems))
        draining = dict(_each("drainingSince", data.get("drainingSince", []), _draining, problems))
        rules = [_field(data, name, problems) for name in ("rulesDigest", "iptablesFingerprint")]
        identities = data.get("identities", {})
        if not isinstance(identities, dict):
            problems.append(f"identities: not an object but {type(identities).__name__}")
            identities = {}
        named = _each("identities", list(identities.items()), _named_identity, problems)
        return cls(
            virtual_servers=virtual_servers,
            draining_since={entry: t for entry, t in draining.items() if t is not None},
            rules_digest=rules[0],
            iptables_fingerprint=rules[1],
            identities=dict(named),
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
    - every journal line is a line of its own, ending with a CRC-32 of its text
      (``_summed``), and starts on a new line even after one cut short (a crash, a full disk:
      ``_append``); a line that is cut, damaged or cannot be read is skipped on its own, the
      lines after it are replayed, and the next save rewrites the snapshot;
    - nothing a file holds can make ``load`` raise or hold more than ``STATE_FILE_MAX_BYTES``:
      each entry is checked (types, ports, addresses, finite times) and one that is not as
      written is left out, the rest kept; a file that cannot be read at all (empty, truncated,
      not JSON, nested too deep, too large, a newer version) loads as empty. ``unreadable``
      says what was left out: the caller falls back to the kernel for it;
    - a failed write raises OSError and leaves the next ``save`` to write a whole snapshot;
      a directory that cannot be written never stops ``open``.
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
        self._damaged = False  # the snapshot last loaded could not be read whole

    def open(self) -> State:
        """``load`` for the one writer (it holds the ``StateLock``): first remove the
        snapshot a crash left half written (a directory that cannot be written keeps it: the
        first save then fails and says why); a snapshot that could not be read whole is
        copied to ``<path>.unreadable`` first, for whoever looks into it. (Readers such as
        ``ipvsproxy status`` must not: it may be the running daemon's.)"""
        with contextlib.suppress(OSError):
            self.tmp.unlink(missing_ok=True)
        state = self.load()
        if self._damaged:
            with contextlib.suppress(OSError):
                shutil.copyfile(self.path, self.path.with_name(self.path.name + ".unreadable"))
        return state

    def load(self) -> State:
        """The state as written, as far as it can be read: see the class's invariants."""
        self.unreadable, self._saved, self._damaged = None, None, False
        problems = Problems()
        try:
            raw = _read(self.path, STATE_FILE_MAX_BYTES)
        except FileNotFoundError:
            return State()
        except (OSError, ValueError) as exc:  # ValueError: too large
            self.unreadable = f"state file {self.path} is unreadable: {exc}"
            return State()
        try:
            data = json.loads(raw)
            state = State.from_json(data, problems)
            generation = str(data.get("generation", ""))
        except _ERRORS as exc:
            self._damaged = True
            self.unreadable = f"state file {self.path} is unreadable: {_why(exc)}"
            return State()
        if problems:
            self._damaged = self._torn = True  # the next save rewrites it without them
        self._generation = generation
        self._snapshot_bytes, self._journal_bytes = len(raw), 0
        for line in self._journal_lines(problems):
            try:
                _replay(state, line, generation)
            except _ERRORS as exc:
                problems.append(f"{self.journal.name}: a line skipped: {_why(exc)}")
                self._torn = True  # the next save rewrites the snapshot without it
        if problems:
            self.unreadable = _unreadable(self.path, problems)
        self._saved = _Saved.of(state)
        state.saved()
        return state

    def _journal_lines(self, problems: Problems) -> list[str]:
        """The journal's whole lines (a last one without its newline was torn while it was
        appended: left out); no more than ``STATE_FILE_MAX_BYTES`` of it is read."""
        try:
            raw = _read(self.journal, STATE_FILE_MAX_BYTES, cut=True)
        except FileNotFoundError:
            return []
        except OSError as exc:
            problems.append(f"{self.journal.name}: {exc}")
            self._torn = True
            return []
        self._journal_bytes = len(raw)
        lines = raw.decode(errors="replace").split("\n")
        if lines[-1]:  # no newline after the last line: torn by a crash while appended
            self._torn = True
        if self._journal_bytes >= STATE_FILE_MAX_BYTES:
            problems.append(f"{self.journal.name}: what follows its first {len(raw)} bytes")
        return [line for line in lines[:-1] if line]

    def save(self, state: State) -> bool:
        """Write if anything changed; return whether it wrote. Raises OSError when the write
        failed (disk full, read-only): then the next save writes a whole snapshot."""
        if self._saved is not None and not self._torn:
            change = self._saved.change(state)
            if change is None:
                state.saved()
                return False
            line = _summed(json.dumps({"gen": self._generation, **change}))
            if self._journal_bytes + len(line) < max(self._snapshot_bytes, JOURNAL_MIN_BYTES):
                self._append(line)
                self._saved.absorb(state, change)
                state.saved()
                return True
        self._write_snapshot(state)
        return True

    def _append(self, line: str) -> None:
        """Append ``line``, on a line of its own even after one cut short (a full disk, a
        crash): so no line ever merges with the one before it."""
        new = self._journal_bytes == 0
        self._torn = True  # until the line is whole on disk
        data = (line + "\n").encode()
        fd = os.open(self.journal, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            _fsync_dir(self.journal.parent)
        self._journal_bytes = size + len(data)
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
# A snapshot larger is not read (nor more of a journal): ~75,000 Services, more than the pod's
# memory holds; a hostile or runaway file must not exhaust it.
STATE_FILE_MAX_BYTES = 64 * 1024 * 1024
# What reading a document written by anyone may raise (deep nesting: RecursionError; 1e400
# as an int: OverflowError); each is a problem with that document, never a crash.
_ERRORS = (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError)
_SUM = re.compile(r'(.*), "sum": "([0-9a-f]{8})"\}', re.DOTALL)


def _key_json(k: ServiceKey) -> list[Any]:
    return [k.address, k.protocol.value, k.port]


def _own_key(data: list[Any]) -> ServiceKey:
    """A key of ``_key_json``'s (this process's own, not read: unchecked)."""
    a, p, port = data
    return ServiceKey(a, Protocol(p), port)


def _address(value: Any) -> str:
    # inet_pton: ipaddress's parse would be most of a large state file's load.
    try:
        socket.inet_pton(socket.AF_INET6 if ":" in value else socket.AF_INET, value)
    except (OSError, TypeError, ValueError):
        raise ValueError(f"not an address: {value!r:.40}") from None
    return str(value)


def _port(value: Any) -> int:
    if type(value) is not int or not 0 <= value <= 65535:
        raise ValueError(f"not a port: {value!r:.40}")
    return value


def _key(data: Any) -> ServiceKey:
    if not isinstance(data, list) or len(data) != 3:
        raise ValueError(f"not a virtual server: {data!r:.60}")
    a, p, port = data
    return ServiceKey(_address(a), Protocol(p), _port(port))


def _draining(data: Any) -> tuple[tuple[ServiceKey, DestKey], float | None]:
    """A draining entry: since when (None in a journal line: no longer draining)."""
    if not isinstance(data, list) or len(data) != 6:
        raise ValueError(f"not a draining real server: {data!r:.60}")
    a, p, port, da, dp, t = data
    entry = (_key([a, p, port]), DestKey(_address(da), _port(dp)))
    if t is not None and (type(t) not in (int, float) or not math.isfinite(t)):
        raise ValueError(f"not a time: {t!r:.40}")
    return entry, None if t is None else float(t)


def _field(data: dict[str, Any], name: str, problems: Problems) -> str:
    value = data.get(name, "")
    if isinstance(value, str):
        return value
    problems.append(f"{name}: not a string")
    return ""  # unknown: the rules are written again


def _named_identity(item: tuple[str, Any]) -> tuple[str, ServiceIdentity]:
    service, data = item
    return service, _identity(service, data)


def _identity(service: str, data: Any) -> ServiceIdentity:
    """``ServiceIdentity.from_json``, checked: what it holds can be written again."""
    if not isinstance(data, dict):
        raise ValueError(f"{service}: not an object")
    ident = ServiceIdentity.from_json(service, data)
    for key in ident.virtual_servers:
        _key(list(key))
    for address, ep in ident.endpoints.items():
        _address(address)
        if not all(v is None or isinstance(v, str) for v in ep):
            raise ValueError(f"{service}: endpoint {address}: not names")
    return ident


def _each(name: str, items: Any, parse: Callable[[Any], Any], problems: Problems) -> Iterator[Any]:
    """``parse`` of each of ``items``; one that cannot be read is said in ``problems``."""
    if not isinstance(items, list):
        problems.append(f"{name}: not a list but {type(items).__name__}")
        return
    for i, item in enumerate(items):
        try:
            yield parse(item)
        except _ERRORS as exc:  # (the message is made only while it is shown)
            problems.append("" if problems.full() else f"{name}[{i}]: {_why(exc)}")


def _why(exc: BaseException) -> str:
    """An exception's message, short: a hostile document's values are not repeated whole."""
    text = f"{type(exc).__name__}: {exc}" if isinstance(exc, RecursionError) else str(exc)
    return text if len(text) <= 160 else text[:160] + "..."


class Problems:
    """What of a state file could not be read: how many parts, the first few said (a
    hostile file's million bad entries are not kept as a million messages)."""

    SHOWN = 3

    def __init__(self) -> None:
        self.count = 0
        self.shown: list[str] = []

    def append(self, what: str) -> None:
        self.count += 1
        if not self.full():
            self.shown.append(what)

    def full(self) -> bool:
        """Whether no more is shown."""
        return len(self.shown) >= self.SHOWN

    def __bool__(self) -> bool:
        return self.count > 0


def _unreadable(path: Path, problems: Problems) -> str:
    shown = "; ".join(problems.shown) + ("; ..." if problems.count > len(problems.shown) else "")
    return f"state file {path} is partly unreadable, {problems.count} parts left out: {shown}"


def _read(path: Path, limit: int, cut: bool = False) -> bytes:
    """``path``'s bytes; more than ``limit`` of them: raise ValueError, or (``cut``) the
    first ``limit``."""
    with path.open("rb") as f:
        if os.fstat(f.fileno()).st_size > limit and not cut:
            raise ValueError(f"larger than {limit} bytes")
        data = f.read(limit + 1)
    if len(data) > limit:
        if not cut:
            raise ValueError(f"larger than {limit} bytes")
        data = data[:limit]
    return data


def _summed(body: str) -> str:
    """A journal line: ``body`` (a JSON object) with the CRC-32 of its text as its last key,
    "sum", so that a line damaged or cut is known (a reader without the check ignores it)."""
    return f'{body[:-1]}, "sum": "{zlib.crc32(body.encode()):08x}"}}'


def _checked(line: str) -> dict[str, Any]:
    """A journal line's object, its check verified (a line written before lines had one
    has none)."""
    m = _SUM.fullmatch(line)
    body = line if m is None else m[1] + "}"
    if m is not None and zlib.crc32(body.encode()) != int(m[2], 16):
        raise ValueError("its check does not match: damaged")
    c = json.loads(body)
    if not isinstance(c, dict):
        raise ValueError("not a JSON object")
    if m is None and "sum" in c:  # a check, but not as written
        raise ValueError("its check is damaged")
    return c


def _replay(state: State, change: str, generation: str) -> None:
    """Apply one journal line (see ``_Saved.change``) to ``state``, if it follows the
    snapshot of ``generation`` (lines written before the 1st generation name none). A line
    is read whole before anything of it is applied: one that cannot be read changes nothing."""
    c = _checked(change)
    if c.get("gen", "") != generation:
        return
    gone = [_key(k) for k in _list(c.get("vs-", []))]
    new = [_key(k) for k in _list(c.get("vs+", []))]
    draining = [_draining(row) for row in _list(c.get("draining", []))]
    rules = c.get("rules")
    if rules is not None and not (
        isinstance(rules, list) and len(rules) == 2 and all(isinstance(x, str) for x in rules)
    ):
        raise ValueError(f"not rules: {rules!r:.60}")
    named = c.get("identities", {})
    if not isinstance(named, dict):
        raise ValueError("identities: not an object")
    identities = {s: None if d is None else _identity(s, d) for s, d in named.items()}
    state.virtual_servers.difference_update(gone)
    state.virtual_servers.update(new)
    for entry, t in draining:
        if t is None:
            state.draining_since.pop(entry, None)
        else:
            state.draining_since[entry] = t
    if rules is not None:
        state.rules_digest, state.iptables_fingerprint = rules
    for service, ident in identities.items():
        if ident is None:
            state.identities.pop(service, None)
        else:
            state.identities[service] = ident


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"not a list: {value!r:.40}")
    return value


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
            self.virtual_servers.difference_update(_own_key(k) for k in change["vs-"])
            self.virtual_servers.update(_own_key(k) for k in change["vs+"])
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


def _write_all(fd: int, data: bytes) -> None:
    """Write all of ``data``: a short write (a disk filling up) goes on with the rest, and
    raises the error that stopped it (ENOSPC when the kernel wrote nothing and said none)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view = view[n:]


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
    its holder's pid, for the message (where it can be written); it is never removed
    (removing it would let a third instance lock a new file while the second holds the old
    one)."""

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
        fd, writable = _open_lock(path)
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
            if writable:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd)

    def release(self) -> None:
        os.close(self.fd)  # closing the only descriptor releases the flock


def _open_lock(path: Path) -> tuple[int, bool]:
    """The lock file, and whether it could be opened to write: in a read-only directory an
    existing one is locked all the same (``flock`` needs no write), without the pid."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644), True
    except OSError as exc:
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC), False
        except OSError:
            raise exc from None
