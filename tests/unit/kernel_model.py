"""A stateful stand-in for the node's kernel, for host tests of the whole dataplane.

The real IPVS, ipset and address backends encode every request with their real codecs; the
socket under them sends nothing and answers each request as a model of the kernel would: it
holds the virtual and real servers, ipset members and bound addresses that were written, and
refuses what the kernel refuses (a real server whose address is not unicast, a /0 in a
hash:ip,port,net set, a duplicate, a missing object), so a test sees every write's outcome.
"""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.diff import AddressOp, DestOp, MemberOp, OpKind, ServiceOp
from ipvsproxy.core.ruleset import Jump
from ipvsproxy.core.virtual_servers import (
    DestKey,
    ObservedDest,
    RealServer,
    Seen,
    ServiceKey,
    VirtualServer,
)
from ipvsproxy.dataplane.dataplane import Backends
from ipvsproxy.kernel.addresses import Addresses
from ipvsproxy.kernel.errors import Counters
from ipvsproxy.kernel.ipset import IPSets
from ipvsproxy.kernel.iptables import Observed
from ipvsproxy.kernel.ipvs import IPVS
from ipvsproxy.kernel.netlink.sock import Outcome

SCHEDULERS = {"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh"}
IPSET_EXISTS, IPSET_BAD_CIDR, IPSET_MISSING = 4103, 4104, 4352


class ModelSocket:
    """A netlink socket whose every request is answered by ``decide(i)`` (the i-th request
    of the batch being applied); dumps are never asked (the backends' reads are modelled)."""

    def __init__(self) -> None:
        self.seq = 0
        self.decide: Callable[[int], int] = lambda i: 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def execute(self, requests: Sequence[tuple[int, bytes]]) -> list[Outcome]:
        for _, msg in requests:
            assert len(msg) >= 16  # a whole netlink message (its header alone is 16 bytes)
        return [Outcome(seq, self.decide(i)) for i, (seq, _) in enumerate(requests)]

    def dump(self, request: bytes, seq: int) -> Iterator[Any]:
        raise AssertionError("reads are modelled, not dumped")

    def close(self) -> None:
        pass


def unicast(address: str, port: int) -> bool:
    """Whether the kernel takes ``address:port`` as an IPv4 real server."""
    ip = ipaddress.ip_address(address)
    return (
        ip.version == 4
        and not ip.is_multicast
        and ip != ipaddress.IPv4Address("255.255.255.255")
        and ip not in ipaddress.IPv4Network("0.0.0.0/8")
        and 0 < port < 65536
    )


class ModelIPVS(IPVS):
    def __init__(self) -> None:
        self.model = ModelSocket()
        super().__init__(self.model, family_id=0x1C)  # type: ignore[arg-type]
        self.services_: dict[ServiceKey, VirtualServer] = {}
        self.dests_: dict[ServiceKey, dict[DestKey, RealServer]] = {}

    def each_service(self) -> Iterator[VirtualServer]:
        return iter(list(self.services_.values()))

    def dests(self, key: ServiceKey) -> dict[DestKey, Seen]:
        return {k: ObservedDest(rs) for k, rs in self.dests_.get(key, {}).items()}

    def apply(self, ops: Sequence[ServiceOp | DestOp]) -> int:
        self.model.decide = lambda i: self._one(ops[i])
        return super().apply(ops)

    def _one(self, op: ServiceOp | DestOp) -> int:
        if isinstance(op, ServiceOp):
            key = op.server.key
            if op.kind is OpKind.DELETE:
                if self.services_.pop(key, None) is None:
                    return errno.ESRCH
                del self.dests_[key]
                return 0
            if op.server.scheduler not in SCHEDULERS:
                return errno.ENOENT
            if (op.kind is OpKind.ADD) == (key in self.services_):
                return errno.EEXIST if op.kind is OpKind.ADD else errno.ESRCH
            self.services_[key] = op.server
            self.dests_.setdefault(key, {})
            return 0
        have = self.dests_.get(op.service)
        if have is None:
            return errno.ESRCH
        dest = op.server.key
        if op.kind is OpKind.DELETE:
            return 0 if have.pop(dest, None) is not None else errno.ENOENT
        if not unicast(dest.address, dest.port):
            return errno.EINVAL
        if (op.kind is OpKind.ADD) == (dest in have):
            return errno.EEXIST if op.kind is OpKind.ADD else errno.ENOENT
        have[dest] = RealServer(dest, op.server.weight, op.server.fwd_method)
        return 0


def _valid_member(set_type: str, entry: str) -> int:
    """0, or ipset's error for an entry of ``set_type`` the kernel refuses."""
    if set_type == "bitmap:port":
        return 0 if 0 <= int(entry) <= 65535 else IPSET_MISSING
    if set_type == "hash:ip,port,net":
        prefix = int(entry.rsplit("/", 1)[1]) if "/" in entry else 32
        return 0 if 0 < prefix <= 32 else IPSET_BAD_CIDR
    return 0


class ModelIPSets(IPSets):
    def __init__(self) -> None:
        self.model = ModelSocket()
        super().__init__(self.model)  # type: ignore[arg-type]
        self.sets: dict[str, set[str]] = {}

    def each_part(self) -> Iterator[tuple[str, list[str]]]:
        return iter([(name, sorted(members)) for name, members in self.sets.items()])

    def ensure(self, existing: Collection[str], names: Iterable[str] = ipset_specs.NAMES) -> int:
        missing = [n for n in names if n not in existing and n not in self.sets]
        for name in missing:
            self.sets[name] = set()
        return len(missing)

    def destroy(self, names: Iterable[str]) -> None:
        for name in names:
            self.sets.pop(name, None)

    def apply(self, ops: Sequence[MemberOp]) -> int:
        self.model.decide = lambda i: self._one(ops[i])
        return super().apply(ops)

    def _one(self, op: MemberOp) -> int:
        members = self.sets.get(op.set_name)
        if members is None:
            return errno.ENOENT
        if op.kind is OpKind.DELETE:
            if op.entry not in members:
                return IPSET_MISSING
            members.discard(op.entry)
            return 0
        refused = _valid_member(ipset_specs.BY_NAME[op.set_name].type, op.entry)
        if refused:
            return refused
        if op.entry in members:
            return IPSET_EXISTS
        members.add(op.entry)
        return 0


class ModelAddresses(Addresses):
    def __init__(self) -> None:
        self.model = ModelSocket()
        super().__init__(sock=self.model)  # type: ignore[arg-type]
        self.addresses: set[str] = set()
        self.node_addresses: list[tuple[int, str]] = []  # (ifindex, address) off the device

    def ensure_device(self) -> int:
        return 1000

    def indexed(self) -> list[tuple[int, str]]:
        return [*self.node_addresses, *((1000, a) for a in sorted(self.addresses))]

    def device_index(self) -> int | None:
        return 1000

    def bound(self) -> set[str]:
        return set(self.addresses)

    def remove_device(self) -> None:
        self.addresses.clear()

    def apply(self, ops: Sequence[AddressOp]) -> int:
        self.model.decide = lambda i: self._one(ops[i])
        return super().apply(ops)

    def _one(self, op: AddressOp) -> int:
        if op.kind is OpKind.ADD:
            if op.address in self.addresses:
                return errno.EEXIST
            self.addresses.add(op.address)
            return 0
        if op.address not in self.addresses:
            return errno.EADDRNOTAVAIL
        self.addresses.discard(op.address)
        return 0


class ModelIPTables:
    """The rules text as last restored; every jump in place once restored."""

    def __init__(self) -> None:
        self.counters = Counters()
        self.restore_failures = 0
        self.text: str | None = None

    def read(self) -> Observed:
        return Observed(str(hash(self.text)), ())

    def apply(self, text: str, missing_jumps: Sequence[Jump] = ()) -> None:
        self.counters.count("restore", True)
        self.text = text

    def remove(self) -> None:
        self.text = None


class ModelConntrack:
    def __init__(self) -> None:
        self.counters = Counters()

    def flush_stale(
        self, service: ServiceKey, live: Collection[str], gone: Collection[str] = ()
    ) -> int:
        return 0

    def close(self) -> None:
        pass


class ModelSysctls:
    def __init__(self) -> None:
        self.counters = Counters()
        self.values: dict[str, str] = {}

    def read(self, names: Mapping[str, str]) -> dict[str, str]:
        return {n: self.values.get(n, "0") for n in names}

    def ensure(self, values: Mapping[str, str]) -> list[str]:
        written = [n for n, v in values.items() if self.values.get(n) != v]
        self.values.update(values)
        return written


def model_backends() -> tuple[Backends, ModelIPVS, ModelIPSets, ModelAddresses]:
    ipvs, ipsets, addresses = ModelIPVS(), ModelIPSets(), ModelAddresses()
    fakes: Any = (ModelIPTables(), ModelConntrack(), ModelSysctls())
    return Backends(ipvs, addresses, ipsets, *fakes), ipvs, ipsets, addresses
