"""A fake of IPVS: virtual servers and their real servers, as upstream's ``FakeIPVS``."""

from __future__ import annotations

import errno
import ipaddress
from collections.abc import Iterator, Sequence
from functools import lru_cache

from ipvsproxy.core.diff import DestOp, OpKind, ServiceOp
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
from ipvsproxy.kernel.errors import settle_batch
from ipvsproxy.kernel.fakes.faults import FakeBackend

# The schedulers of the lab's kernel (ip_vs_*.ko built in).
SCHEDULERS = frozenset({"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh"})


KERNEL_DEFAULT_TIMEOUTS = (900, 120, 300)  # tcp, tcpfin, udp: a fresh kernel's


@lru_cache(maxsize=1 << 16)
def unicast(address: str) -> bool:
    """Whether the kernel takes ``address`` as a real server of a virtual server of its
    family: IPv4 by inet_addr_type (unicast or local; not 0.0.0.0/8, multicast or the
    broadcast address), IPv6 by ipv6_addr_type (unicast, not link-local; the node's own
    link-local addresses are not modelled). Any port is taken, 0 too."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if ip.version == 6:
        return not (ip.is_multicast or ip.is_unspecified or ip.is_link_local)
    return (
        ip.version == 4
        and not ip.is_multicast
        and ip != ipaddress.IPv4Address("255.255.255.255")
        and ip not in ipaddress.IPv4Network("0.0.0.0/8")
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
            if not unicast(dest.address):
                return errno.EINVAL
        elif dest not in have:
            return errno.ENOENT
        have[dest] = RealServer(dest, op.server.weight, op.server.fwd_method)
        return 0

    def read_timeouts(self) -> tuple[int, int, int]:
        """As set, or the kernel's defaults before any set."""
        self.on_call("read_timeouts")
        return self.timeouts or KERNEL_DEFAULT_TIMEOUTS

    def set_timeouts(self, tcp: int, tcp_fin: int, udp: int) -> None:
        self.on_call("set_timeouts", tcp, tcp_fin, udp)
        self.timeouts = (tcp, tcp_fin, udp)
        self.counters.count("set_config", True)

    def close(self) -> None:
        self.on_call("close")
