"""Stateful fakes of the kernel backends, for tests of the dataplane without a kernel.

Each fake satisfies its interface (``interfaces.py``) and holds its own table of what the
kernel would hold, as upstream kube-proxy's ``FakeIPVS`` does: virtual servers and their real
servers with weights and connection counts, the members of each ipset, the addresses on each
device, the iptables chains' rules, UDP conntrack entries, sysctl values. Every fake

- counts its writes in ``counters`` (``Counters``) by the kinds the real backend uses, so that
  ``SyncResult.writes`` means the same over fakes as over the kernel;
- refuses what the kernel refuses, with the kernel's errno, through the same ``ApplyError``
  and ``Rejected`` as the real backend (the table of refusals is each interface's docstring;
  tests/kernel/test_kernel_conformance.py runs the same scenarios on the fakes and on the lab's
  kernel, so the two cannot drift apart);
- can be told to refuse an operation the kernel would take: ``refuse(errno, where, nth,
  times)`` refuses the ``nth`` operation that ``where`` matches (and ``times - 1`` more after
  it; ``times=None``: all of them) with ``errno``, reported as the kernel reports a refusal;
- can be told to raise from a method: ``raise_from(method, exc, where, times)`` raises ``exc``
  from the next ``times`` calls of ``method`` whose arguments ``where`` matches, before it does
  anything (an ``OSError`` from a dump, pyroute2's ``NetlinkError``, a codec's bug);
- counts its calls by method (``calls``), faults included.

State ipvsproxy did not create (someone else's virtual servers, sets, addresses, chains, and
connections) is seeded with the ``add_*``/``run`` helpers, which count no write. The fakes take
values the real backends' codecs could not encode (a port above 65535): the codec is the real
backends' own, and ``fake_netlink`` runs it over these tables.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Generic, NamedTuple, TypeVar

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.diff import AddressOp, DestOp, MemberOp, OpKind, ServiceOp
from ipvsproxy.core.ruleset import JUMPS, Jump
from ipvsproxy.core.virtual_servers import (
    IDLE,
    SVC_F_HASHED,
    DestKey,
    DestStats,
    ObservedDest,
    RealServer,
    Seen,
    ServiceKey,
    Traffic,
    VirtualServer,
)
from ipvsproxy.kernel.addresses import DUMMY_DEVICE
from ipvsproxy.kernel.backends import Backends
from ipvsproxy.kernel.conntrack import stale
from ipvsproxy.kernel.errors import ApplyError, Counters, Rejected, Result, settle, settle_batch
from ipvsproxy.kernel.iptables import OURS, Observed, observe, with_jumps
from ipvsproxy.kernel.netlink.ipset_messages import ERRORS as IPSET_ERRORS

# The schedulers of the lab's kernel (ip_vs_*.ko built in).
SCHEDULERS = frozenset({"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh"})
# ipset's own error codes (include/uapi/linux/netfilter/ipset/ip_set.h).
IPSET_ERR_TYPE_NOT_SUPPORTED = 4098
IPSET_ERR_EXIST = 4103
IPSET_ERR_INVALID_CIDR = 4104
IPSET_ERR_REFERENCED = 4108
IPSET_ERR_TYPE_SPECIFIC = 4352  # e.g. a port out of a bitmap's range

Op = TypeVar("Op")


def _every(_op: object) -> bool:
    return True


def _any_call(*_args: object) -> bool:
    return True


@dataclass
class Refusal(Generic[Op]):
    """Refuse the ``nth`` operation ``where`` matches, and ``times - 1`` more after it (None:
    every later one), with ``errno``."""

    errno: int
    where: Callable[[Op], bool] = _every
    nth: int = 1
    times: int | None = 1
    matched: int = 0
    refused: int = 0

    def takes(self, op: Op) -> bool:
        if not self.where(op):
            return False
        self.matched += 1
        if self.matched < self.nth or (self.times is not None and self.refused >= self.times):
            return False
        self.refused += 1
        return True


@dataclass
class Raising:
    """Raise ``exc`` from the next ``times`` calls (None: every one) of ``method`` whose
    arguments ``where`` matches."""

    method: str
    exc: BaseException
    where: Callable[..., bool] = _any_call
    times: int | None = 1
    raised: int = 0


class FakeBackend(Generic[Op]):
    """What every fake has: its counters and calls, and what it is told to get wrong."""

    def __init__(self) -> None:
        self.counters = Counters()
        self.calls: Counter[str] = Counter()
        self.refusals: list[Refusal[Op]] = []
        self.raisings: list[Raising] = []

    def refuse(
        self,
        errno: int,
        where: Callable[[Op], bool] = _every,
        nth: int = 1,
        times: int | None = 1,
    ) -> Refusal[Op]:
        """Refuse an operation the kernel would take (see ``Refusal``); the first refusal
        told that takes an operation refuses it."""
        refusal = Refusal(errno, where, nth, times)
        self.refusals.append(refusal)
        return refusal

    def raise_from(
        self,
        method: str,
        exc: BaseException,
        where: Callable[..., bool] = _any_call,
        times: int | None = 1,
    ) -> Raising:
        if not callable(getattr(type(self), method, None)):
            raise ValueError(f"{type(self).__name__} has no method {method!r}")
        raising = Raising(method, exc, where, times)
        self.raisings.append(raising)
        return raising

    def on_call(self, method: str, *args: object) -> None:
        """What each method does first: count the call, raise what it was told to."""
        self.calls[method] += 1
        for r in self.raisings:
            if r.method == method and (r.times is None or r.raised < r.times) and r.where(*args):
                r.raised += 1
                raise r.exc

    def _refused(self, op: Op) -> int:
        for refusal in self.refusals:
            if refusal.takes(op):
                return refusal.errno
        return 0


# -- IPVS ----------------------------------------------------------------------------------------


@lru_cache(maxsize=1 << 16)
def unicast(address: str, port: int) -> bool:
    """Whether the kernel takes ``address:port`` as the real server of an IPv4 virtual server
    (inet_addr_type: unicast or local; not 0.0.0.0/8, multicast or the broadcast address)."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return (
        ip.version == 4
        and not ip.is_multicast
        and ip != ipaddress.IPv4Address("255.255.255.255")
        and ip not in ipaddress.IPv4Network("0.0.0.0/8")
        and 0 < port < 65536
    )


def as_read(vs: VirtualServer) -> VirtualServer:
    """``vs`` as the kernel reports it back: hashed, its netmask as a prefix length."""
    return VirtualServer(vs.key, vs.scheduler, vs.flags | SVC_F_HASHED, vs.timeout, vs.prefix_len)


def _ipvs_kind(op: ServiceOp | DestOp) -> str:
    return f"{op.kind}_{'service' if isinstance(op, ServiceOp) else 'dest'}"


class FakeIPVS(FakeBackend[ServiceOp | DestOp]):
    """IPVS: ``virtual_servers`` as written, ``real_servers`` of each, ``connections`` of a
    real server (seeded: traffic is the kernel's)."""

    def __init__(self) -> None:
        super().__init__()
        self.virtual_servers: dict[ServiceKey, VirtualServer] = {}
        self.real_servers: dict[ServiceKey, dict[DestKey, RealServer]] = {}
        self.connections: dict[tuple[ServiceKey, DestKey], DestStats] = {}
        self.timeouts: tuple[int, int, int] | None = None

    # seeding

    def add_virtual_server(self, vs: VirtualServer, *real_servers: RealServer | DestKey) -> None:
        """Put ``vs`` and its ``real_servers`` in the table (someone else's), counting no
        write."""
        self.virtual_servers[vs.key] = vs
        have = self.real_servers.setdefault(vs.key, {})
        for rs in real_servers:
            have[rs.key] = RealServer(rs.key, rs.weight, rs.fwd_method)

    def set_connections(
        self, service: ServiceKey, dest: DestKey, active: int = 0, inactive: int = 0
    ) -> None:
        """The connection counts the kernel reports for a real server from now on."""
        assert dest in self.real_servers.get(service, {}), (service, dest)
        self.connections[service, dest] = DestStats(active, inactive)

    # reads

    def services(self) -> dict[ServiceKey, VirtualServer]:
        self.on_call("services")
        return {vs.key: vs for vs in self.each_service()}

    def each_service(self) -> Iterator[VirtualServer]:
        self.on_call("each_service")
        return iter([as_read(vs) for vs in self.virtual_servers.values()])

    def dests(self, key: ServiceKey) -> dict[DestKey, Seen]:
        self.on_call("dests", key)
        return {
            d: ObservedDest(rs, self.connections.get((key, d), IDLE))
            for d, rs in self.real_servers.get(key, {}).items()
        }

    def services_with_traffic(self) -> dict[ServiceKey, tuple[VirtualServer, Traffic]]:
        self.on_call("services_with_traffic")
        return {key: (as_read(vs), Traffic()) for key, vs in self.virtual_servers.items()}

    def dests_with_traffic(self, key: ServiceKey) -> dict[DestKey, tuple[ObservedDest, Traffic]]:
        self.on_call("dests_with_traffic", key)
        return {
            d: (ObservedDest(rs, self.connections.get((key, d), IDLE)), Traffic())
            for d, rs in self.real_servers.get(key, {}).items()
        }

    # writes

    def apply(self, ops: Sequence[ServiceOp | DestOp]) -> int:
        self.on_call("apply", ops)
        if not ops:
            return 0
        errnos = [self.outcome(op) for op in ops]
        kinds = [_ipvs_kind(op) for op in ops]
        return settle_batch(kinds, errnos, lambda i: str(ops[i]), self.counters)

    def outcome(self, op: ServiceOp | DestOp) -> int:
        """Apply one operation to the table as the kernel would; its errno (0: applied).
        Counted by whoever settles the batch."""
        refused = self._refused(op)
        if refused:
            return refused
        if isinstance(op, ServiceOp):
            return self._service(op)
        return self._dest(op)

    def _service(self, op: ServiceOp) -> int:
        vs = op.server
        exists = vs.key in self.virtual_servers
        if op.kind is OpKind.DELETE:
            if not exists:
                return errno.ESRCH
            del self.virtual_servers[vs.key]
            for dest in self.real_servers.pop(vs.key):
                self.connections.pop((vs.key, dest), None)
            return 0
        if op.kind is OpKind.ADD and exists:
            return errno.EEXIST
        if op.kind is OpKind.SET and not exists:
            return errno.ESRCH
        if vs.scheduler not in SCHEDULERS:
            return errno.ENOENT
        self.virtual_servers[vs.key] = vs
        self.real_servers.setdefault(vs.key, {})
        return 0

    def _dest(self, op: DestOp) -> int:
        have = self.real_servers.get(op.service)
        if have is None:
            return errno.ESRCH
        dest = op.server.key
        if op.kind is OpKind.DELETE:
            if have.pop(dest, None) is None:
                return errno.ENOENT
            self.connections.pop((op.service, dest), None)
            return 0
        if op.server.weight < 0:
            return errno.ERANGE
        if op.kind is OpKind.ADD:
            if dest in have:
                return errno.EEXIST
            if not unicast(dest.address, dest.port):
                return errno.EINVAL
        elif dest not in have:
            return errno.ENOENT
        have[dest] = RealServer(dest, op.server.weight, op.server.fwd_method)
        return 0

    def set_timeouts(self, tcp: int, tcp_fin: int, udp: int) -> None:
        self.on_call("set_timeouts", tcp, tcp_fin, udp)
        self.timeouts = (tcp, tcp_fin, udp)
        self.counters.count("set_config", True)

    def close(self) -> None:
        self.on_call("close")


# -- ipsets --------------------------------------------------------------------------------------


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
                code = IPSET_ERR_REFERENCED
            if code:
                results.append(Result("set", f"destroy ipset {name}: {_ipset_why(code)}", code))
                continue
            del self.sets[name], self.types[name]
            results.append(Result("set", f"destroy ipset {name}", 0))
        settle(results, self.counters)

    def close(self) -> None:
        self.on_call("close")


# -- addresses -----------------------------------------------------------------------------------


@dataclass
class Device:
    index: int
    addresses: set[str] = field(default_factory=set)


class FakeAddresses(FakeBackend[AddressOp]):
    """Network devices by name with their addresses: the loopback device at first, kube-ipvs0
    once an address is bound (or seeded)."""

    def __init__(self, device: str = DUMMY_DEVICE) -> None:
        super().__init__()
        self.device = device
        self.devices: dict[str, Device] = {"lo": Device(1, {"127.0.0.1"})}

    def add_device(self, name: str, *addresses: str) -> int:
        """Create a device (if missing) with ``addresses`` on it, counting no write; its
        index."""
        index = max(d.index for d in self.devices.values()) + 1
        dev = self.devices.setdefault(name, Device(index))
        dev.addresses.update(addresses)
        return dev.index

    def bound(self) -> set[str]:
        self.on_call("bound")
        dev = self.devices.get(self.device)
        return set(dev.addresses) if dev is not None else set()

    def indexed(self) -> list[tuple[int, str]]:
        self.on_call("indexed")
        return [(d.index, a) for d in self.devices.values() for a in sorted(d.addresses)]

    def device_index(self) -> int | None:
        self.on_call("device_index")
        dev = self.devices.get(self.device)
        return dev.index if dev is not None else None

    def ensure_device(self) -> int:
        self.on_call("ensure_device")
        if self.device not in self.devices:
            self.add_device(self.device)
            self.counters.count("add_device", True)
        return self.devices[self.device].index

    def apply(self, ops: Sequence[AddressOp]) -> int:
        self.on_call("apply", ops)
        if not ops:
            return 0
        self.ensure_device()
        errnos = [self.outcome(op) for op in ops]
        return settle_batch(
            [f"{op.kind}_address" for op in ops],
            errnos,
            lambda i: f"{ops[i]} on {self.device}",
            self.counters,
        )

    def outcome(self, op: AddressOp) -> int:
        """Apply one operation to kube-ipvs0 as the kernel would; its errno (0: applied)."""
        refused = self._refused(op)
        if refused:
            return refused
        bound = self.devices[self.device].addresses
        if op.kind is OpKind.ADD:
            if op.address in bound:
                return errno.EEXIST
            bound.add(op.address)
            return 0
        if op.address not in bound:
            return errno.EADDRNOTAVAIL
        bound.discard(op.address)
        return 0

    def remove_device(self) -> None:
        self.on_call("remove_device")
        if self.devices.pop(self.device, None) is not None:
            self.counters.count("delete_device", True)

    def close(self) -> None:
        self.on_call("close")


# -- iptables ------------------------------------------------------------------------------------

BUILT_IN = {
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
}
TARGETS = frozenset(
    {"ACCEPT", "DROP", "RETURN", "REJECT", "MARK", "MASQUERADE", "SNAT", "DNAT", "LOG"}
)
_TARGET = re.compile(r"(?:^|\s)-j\s+(\S+)")
_MATCH_SET = re.compile(r"--match-set\s+(\S+)")


class Refused(Exception):
    """A command iptables refuses."""


class FakeIPTables(FakeBackend[str]):
    """iptables: ``tables`` of chains, each with its rules (what follows ``-A CHAIN``); a
    refusal matches a restore's whole input. ``sets`` are the ipsets that exist (a rule may
    match only those)."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, dict[str, list[str]]] = {
            t: {c: [] for c in chains} for t, chains in BUILT_IN.items()
        }
        self.restore_failures = 0
        self.sets: Callable[[], Collection[str]] = frozenset

    def run(self, table: str, command: str) -> None:
        """``iptables -t TABLE COMMAND`` (-N, -A, -I, -D, -F, -X), counting no write; raises
        ``Refused`` as iptables would fail."""
        _command(self.tables[table], BUILT_IN[table], command, self.sets())

    def save(self, table: str) -> str:
        """``iptables-save -t TABLE``."""
        chains = self.tables[table]
        lines = [f"*{table}"]
        lines += [f":{c} {'ACCEPT' if c in BUILT_IN[table] else '-'} [0:0]" for c in chains]
        lines += [f"-A {c} {rule}" for c, rules in chains.items() for rule in rules]
        return "\n".join([*lines, "COMMIT", ""])

    def referenced_sets(self) -> set[str]:
        return {
            name
            for chains in self.tables.values()
            for rules in chains.values()
            for rule in rules
            for name in _MATCH_SET.findall(rule)
        }

    def read(self) -> Observed:
        self.on_call("read")
        return observe({table: self.save(table) for table in ("nat", "filter")})

    def missing_jumps_checked(self) -> tuple[Jump, ...]:
        self.on_call("missing_jumps_checked")
        return tuple(j for j in JUMPS if not self._in_place(j))

    def _in_place(self, jump: Jump) -> bool:
        chains = self.tables[jump.table]
        return jump.target in chains and jump.spec() in chains.get(jump.chain, [])

    def apply(self, text: str, missing_jumps: Sequence[Jump] = ()) -> None:
        """``iptables-restore --noflush``: each table's part is one transaction, committed
        at its COMMIT; a declared chain of ours is created or flushed."""
        self.on_call("apply", text, missing_jumps)
        payload = with_jumps(text, missing_jumps)
        refused = self._refused(payload)
        why = f"iptables-restore: {os.strerror(refused)}" if refused else None
        if why is None:
            try:
                self._restore(payload)
            except Refused as exc:
                why = f"iptables-restore: {exc}"
        self.counters.count("restore", why is None)
        if why is not None:
            self.restore_failures += 1
            raise ApplyError([Rejected(why, errno.EINVAL)], 0)

    def _restore(self, payload: str) -> None:
        table: str | None = None
        chains: dict[str, list[str]] = {}
        sets = self.sets()
        for n, line in enumerate(payload.splitlines(), 1):
            if not line.strip() or line.startswith("#"):
                continue
            if line.startswith("*"):
                table = line[1:]
                if table not in self.tables:
                    raise Refused(f"line {n}: no table {table}")
                chains = {c: list(rules) for c, rules in self.tables[table].items()}
            elif table is None:
                raise Refused(f"line {n}: outside a table")
            elif line == "COMMIT":
                self.tables[table], table = chains, None
            elif line.startswith(":"):
                chain = line[1:].split(" ", 1)[0]
                if chain not in BUILT_IN[table]:
                    chains[chain] = []  # created, or flushed: --noflush flushes a declared chain
            else:
                try:
                    _command(chains, BUILT_IN[table], line, sets)
                except Refused as exc:
                    raise Refused(f"line {n}: {exc}") from None
        if table is not None:
            raise Refused(f"no COMMIT for table {table}")

    def remove(self) -> None:
        self.on_call("remove")
        for jump in JUMPS:
            while self._try(jump.table, f"-D {jump.chain} {jump.spec()}"):
                pass
        for table, names in OURS.items():
            for chain in sorted(names):
                self._try(table, f"-F {chain}")
            for chain in sorted(names):
                self._try(table, f"-X {chain}")

    def _try(self, table: str, command: str) -> bool:
        try:
            self.run(table, command)
        except Refused:
            return False
        return True


def _command(
    chains: dict[str, list[str]], built_in: Sequence[str], command: str, sets: Collection[str]
) -> None:
    """One iptables command on a table's ``chains``."""
    verb, _, rest = command.partition(" ")
    chain, _, spec = rest.partition(" ")
    if verb == "-N":
        if chain in chains:
            raise Refused(f"chain {chain} exists")
        chains[chain] = []
        return
    if chain not in chains:
        raise Refused(f"no chain {chain}")
    rules = chains[chain]
    if verb == "-F":
        rules.clear()
    elif verb == "-X":
        if chain in built_in or rules:
            raise Refused(f"chain {chain} is built in or not empty")
        if any(target == chain for r in _all_rules(chains) for target in _TARGET.findall(r)):
            raise Refused(f"chain {chain} is referenced")
        del chains[chain]
    elif verb == "-D":
        if spec not in rules:
            raise Refused(f"no such rule in {chain}: {spec}")
        rules.remove(spec)
    elif verb in ("-A", "-I"):
        position = 0
        if verb == "-I":
            first, _, after = spec.partition(" ")
            if first.isdigit():
                position, spec = int(first) - 1, after
        for target in _TARGET.findall(spec):
            if target not in TARGETS and target not in chains:
                raise Refused(f"no chain or target {target}")
        for name in _MATCH_SET.findall(spec):
            if name not in sets:
                raise Refused(f"set {name} does not exist")
        if verb == "-A":
            rules.append(spec)
        else:
            rules.insert(position, spec)
    else:
        raise Refused(f"unknown command {verb}")


def _all_rules(chains: Mapping[str, list[str]]) -> Iterator[str]:
    for rules in chains.values():
        yield from rules


# -- conntrack -----------------------------------------------------------------------------------


class FakeConntrack(FakeBackend[tuple[ServiceKey, str]]):
    """UDP conntrack entries: ``flows`` to each virtual server, each by the address of the
    real server that answers it (seeded: traffic makes them); ``flushes`` records each call
    (service, live, gone). A refusal matches (service, answering address) of one entry."""

    def __init__(self) -> None:
        super().__init__()
        self.flows: dict[ServiceKey, list[str]] = {}
        self.flushes: list[tuple[ServiceKey, frozenset[str], frozenset[str]]] = []

    def add_flow(self, service: ServiceKey, answered_by: str) -> None:
        self.flows.setdefault(service, []).append(answered_by)

    def flush_stale(
        self, service: ServiceKey, live: Collection[str], gone: Collection[str] = ()
    ) -> int:
        self.on_call("flush_stale", service, live, gone)
        self.flushes.append((service, frozenset(live), frozenset(gone)))
        kept: list[str] = []
        deleted = 0
        for source in self.flows.get(service, []):
            if not stale(source, live, gone):
                kept.append(source)
            elif self._refused((service, source)):
                self.counters.count("delete_conntrack", False)
                kept.append(source)
            else:
                self.counters.count("delete_conntrack", True)
                deleted += 1
        if service in self.flows:
            self.flows[service] = kept
        return deleted

    def close(self) -> None:
        self.on_call("close")


# -- sysctls -------------------------------------------------------------------------------------

# A fresh node's kernel: ip_vs just loaded, conntrack at its own defaults.
FRESH_NODE = {
    "net/ipv4/vs/conntrack": "0",
    "net/ipv4/vs/expire_nodest_conn": "0",
    "net/ipv4/vs/expire_quiescent_template": "0",
    "net/ipv4/vs/conn_reuse_mode": "1",
    "net/ipv4/ip_forward": "0",
    "net/ipv4/conf/all/arp_ignore": "0",
    "net/ipv4/conf/all/arp_announce": "0",
    "net/netfilter/nf_conntrack_max": "65536",
    "net/netfilter/nf_conntrack_tcp_timeout_established": "432000",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait": "60",
    "net/netfilter/nf_conntrack_udp_timeout": "30",
    "net/netfilter/nf_conntrack_udp_timeout_stream": "120",
    "net/netfilter/nf_conntrack_tcp_be_liberal": "0",
}


class FakeSysctls(FakeBackend[str]):
    """Settings by their path under /proc/sys (``values``; a fresh node's by default); a
    refusal matches a setting's name and refuses its write."""

    def __init__(self, values: Mapping[str, str] = FRESH_NODE) -> None:
        super().__init__()
        self.values = dict(values)

    def read(self, names: Mapping[str, str]) -> dict[str, str]:
        self.on_call("read", names)
        missing = [n for n in names if n not in self.values]
        if missing:
            code = errno.ENOENT
            raise FileNotFoundError(code, os.strerror(code), f"/proc/sys/{missing[0]}")
        return {n: self.values[n] for n in names}

    def ensure(self, values: Mapping[str, str]) -> list[str]:
        self.on_call("ensure", values)
        current = self.read(values)
        written = []
        for name, value in values.items():
            if current[name] != value:
                refused = self._refused(name)
                if refused:
                    raise OSError(refused, os.strerror(refused), f"/proc/sys/{name}")
                self.values[name] = value
                self.counters.count("sysctl", True)
                written.append(name)
        return written


# -- all of them ---------------------------------------------------------------------------------


@dataclass
class FakeBackends(Backends):
    """``Backends`` of fakes, typed as such for the tests that look into their tables."""

    ipvs: FakeIPVS
    addresses: FakeAddresses
    ipsets: FakeIPSets
    iptables: FakeIPTables
    conntrack: FakeConntrack
    sysctls: FakeSysctls


def wire(ipsets: FakeIPSets, iptables: FakeIPTables) -> None:
    """A rule may match only a set that exists, and a set a rule matches cannot be destroyed:
    each fake asks the other."""
    iptables.sets = lambda: ipsets.sets.keys()
    ipsets.referenced = iptables.referenced_sets


def fake_backends() -> FakeBackends:
    """A fresh node's kernel, as fakes: no kube-ipvs0, no ipsets, no chains of ours."""
    ipsets, iptables = FakeIPSets(), FakeIPTables()
    wire(ipsets, iptables)
    return FakeBackends(
        FakeIPVS(), FakeAddresses(), ipsets, iptables, FakeConntrack(), FakeSysctls()
    )
