"""A fake of ipset: sets by name with their members, in the kernel's canonical form."""

from __future__ import annotations

import errno
import ipaddress
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import NamedTuple

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.diff import MemberOp, OpKind
from ipvsproxy.kernel.errors import Result, settle, settle_batch
from ipvsproxy.kernel.fakes.faults import FakeBackend
from ipvsproxy.kernel.netlink.ipset_messages import ERRORS as IPSET_ERRORS

# ipset's own error codes (include/uapi/linux/netfilter/ipset/ip_set.h).
IPSET_ERR_TYPE_NOT_SUPPORTED = 4098
IPSET_ERR_EXIST = 4103
IPSET_ERR_INVALID_CIDR = 4104
IPSET_ERR_BUSY = 4100  # in use by a kernel component (an iptables rule)
IPSET_ERR_TYPE_SPECIFIC = 4352  # e.g. a port out of a bitmap's range


class SetOp(NamedTuple):
    """Creating (ADD) or destroying (DELETE) a set: what a refusal of those matches."""

    kind: OpKind
    name: str

    def __str__(self) -> str:
        return f"{'create' if self.kind is OpKind.ADD else 'destroy'} ipset {self.name}"


def member(set_type: str, entry: str) -> tuple[int, str]:
    """(0, the entry as the kernel holds it), or (ipset's error, entry) for an entry a set of
    ``set_type`` cannot hold."""
    if set_type == "bitmap:port":
        port = int(entry)
        return (0, str(port)) if 0 <= port <= 65535 else (IPSET_ERR_TYPE_SPECIFIC, entry)
    if set_type == "hash:ip,port,net":
        head, net = entry.rsplit(",", 1)
        network = ipaddress.ip_network(net, strict=False)
        if network.prefixlen == 0:
            return IPSET_ERR_INVALID_CIDR, entry
        return 0, f"{head},{network}"
    return 0, entry


def _ipset_why(code: int) -> str:
    return IPSET_ERRORS.get(code) or os.strerror(code)


class FakeIPSets(FakeBackend[MemberOp | SetOp]):
    """ipsets: ``sets`` by name with their members, ``types`` of each; ``referenced`` says
    which sets a rule names (those cannot be destroyed); ``unsupported_types`` are set types
    the kernel lacks."""

    def __init__(self) -> None:
        super().__init__()
        self.sets: dict[str, set[str]] = {}
        self.types: dict[str, str] = {}
        self.unsupported_types: set[str] = set()
        self.referenced: Callable[[], Collection[str]] = frozenset

    def add_set(self, name: str, set_type: str | None = None, members: Iterable[str] = ()) -> None:
        """Create a set (ours by default type, or anyone's), counting no write."""
        set_type = set_type or ipset_specs.BY_NAME[name].type
        self.types[name] = set_type
        self.sets[name] = {member(set_type, e)[1] for e in members}

    def read(self) -> dict[str, set[str]]:
        self.on_call("read")
        sets: dict[str, set[str]] = {}
        for name, members in self.each_part():
            sets.setdefault(name, set()).update(members)
        return sets

    def each_part(self) -> Iterator[tuple[str, list[str]]]:
        self.on_call("each_part")
        parts = [(n, sorted(m)) for n, m in self.sets.items() if n in ipset_specs.NAMES]
        return iter(parts)

    def ensure(self, existing: Collection[str], names: Iterable[str] = ipset_specs.NAMES) -> int:
        self.on_call("ensure", existing, names)
        missing = [ipset_specs.BY_NAME[n] for n in sorted(names) if n not in existing]
        if not missing:
            return 0
        for spec in missing:
            if spec.type in self.unsupported_types:
                why = _ipset_why(IPSET_ERR_TYPE_NOT_SUPPORTED)
                settle(
                    [Result("set", f"ipset type {spec.type}: {why}", IPSET_ERR_TYPE_NOT_SUPPORTED)],
                    self.counters,
                )
        errnos = []
        for spec in missing:
            code = self._refused(SetOp(OpKind.ADD, spec.name))
            if not code and spec.name in self.sets:
                code = errno.EEXIST
            if not code:
                self.add_set(spec.name)
            errnos.append(code)

        def describe(i: int) -> str:
            return f"create ipset {missing[i].name}: {_ipset_why(errnos[i])}"

        settle_batch(["set"] * len(missing), errnos, describe, self.counters)
        return len(missing)

    def apply(self, ops: Sequence[MemberOp]) -> int:
        self.on_call("apply", ops)
        if not ops:
            return 0
        errnos = [self.outcome(op) for op in ops]
        kinds = [f"{op.kind}_member" for op in ops]

        def describe(i: int) -> str:
            return f"{ops[i]}: {_ipset_why(errnos[i])}"

        return settle_batch(kinds, errnos, describe, self.counters)

    def outcome(self, op: MemberOp) -> int:
        """Apply one operation to the table as the kernel would; its errno (0: applied)."""
        refused = self._refused(op)
        if refused:
            return refused
        members = self.sets.get(op.set_name)
        if members is None:
            return errno.ENOENT
        code, entry = member(self.types[op.set_name], op.entry)
        if code:
            return code
        if op.kind is OpKind.ADD:
            if entry in members:
                return IPSET_ERR_EXIST
            members.add(entry)
            return 0
        if entry not in members:
            return IPSET_ERR_EXIST
        members.discard(entry)
        return 0

    def destroy(self, names: Iterable[str]) -> None:
        self.on_call("destroy", names)
        results = []
        referenced = self.referenced()
        for name in sorted(n for n in names if n in ipset_specs.NAMES):
            code = self._refused(SetOp(OpKind.DELETE, name))
            if not code and name not in self.sets:
                code = errno.ENOENT
            if not code and name in referenced:
                code = IPSET_ERR_BUSY
            if code:
                results.append(Result("set", f"destroy ipset {name}: {_ipset_why(code)}", code))
                continue
            del self.sets[name], self.types[name]
            results.append(Result("set", f"destroy ipset {name}", 0))
        settle(results, self.counters)

    def close(self) -> None:
        self.on_call("close")
