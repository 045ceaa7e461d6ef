"""The dataplane's vocabulary: what a node's kernel holds for Services, as plain values.

Everything here is immutable and hashable so that desired and observed state can be compared
key by key, and so that the planner (pure) and the backends (I/O) share one language without
either importing the other. Addresses are strings in their canonical form; nothing here assumes
an address family.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from operator import attrgetter
from typing import NamedTuple


class Protocol(StrEnum):
    TCP = "TCP"
    UDP = "UDP"
    SCTP = "SCTP"

    @property
    def number(self) -> int:
        return _IPPROTO[self]

    @classmethod
    def from_number(cls, number: int) -> Protocol:
        for proto, num in _IPPROTO.items():
            if num == number:
                return proto
        raise ValueError(f"unsupported IP protocol number {number}")


_IPPROTO = {Protocol.TCP: 6, Protocol.UDP: 17, Protocol.SCTP: 132}

# IPVS service flags that userspace sets (the kernel adds IP_VS_SVC_F_HASHED itself).
SVC_F_PERSISTENT = 0x0001
SVC_F_HASHED = 0x0002
USER_FLAGS_MASK = 0xFFFFFFFF & ~SVC_F_HASHED

# Forwarding methods (IP_VS_CONN_F_*); kube-proxy uses masquerade (NAT).
FWD_MASQ = 0
FWD_LOCALNODE = 1
FWD_TUNNEL = 2
FWD_DROUTE = 3


# A dotted quad already in canonical form (no leading zeros, every octet <= 255): most of what
# the API sends. Such text is its own canonical spelling; parsing it would only cost time.
_CANONICAL_IPV4 = re.compile(
    r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
    r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
).fullmatch


def canonical_ip(text: str) -> str:
    """One spelling per address, so keys from the API and from the kernel compare equal."""
    if type(text) is str and _CANONICAL_IPV4(text):
        return text
    return str(ipaddress.ip_address(text))


def is_ipv6(address: str) -> bool:
    return ":" in address


class ServiceKey(NamedTuple):
    """The identity of an IPVS virtual server. A named tuple rather than a dataclass: keys are
    hashed and compared millions of times in a cold sync, and a tuple does both in C (a
    dataclass's generated __hash__ is a Python call each time)."""

    address: str
    protocol: Protocol
    port: int

    def __str__(self) -> str:
        host = f"[{self.address}]" if is_ipv6(self.address) else self.address
        return f"{self.protocol.value} {host}:{self.port}"


# Sort keys for ServiceKey and DestKey: the same order as the dataclasses' own (field by field),
# compared in C rather than through the generated __lt__.
SERVICE_ORDER = attrgetter("address", "protocol", "port")
DEST_ORDER = attrgetter("address", "port")


@dataclass(frozen=True, slots=True)
class VirtualServer:
    key: ServiceKey
    scheduler: str = "rr"
    flags: int = 0
    timeout: int = 0  # persistence, seconds; only with SVC_F_PERSISTENT
    netmask: int = -1  # persistence granularity as a prefix length; -1: a single host

    @property
    def prefix_len(self) -> int:
        if self.netmask >= 0:
            return self.netmask
        return 128 if is_ipv6(self.key.address) else 32

    def same_settings(self, other: VirtualServer) -> bool:
        """Whether ``other`` (typically read back from the kernel) needs no update to be this."""
        return (
            self.scheduler == other.scheduler
            and (self.flags & USER_FLAGS_MASK) == (other.flags & USER_FLAGS_MASK)
            and self.timeout == other.timeout
            and self.prefix_len == other.prefix_len
        )


class DestKey(NamedTuple):
    """The identity of a real server within a virtual server (a named tuple: see ServiceKey).

    A key is also the real server it names with the settings the planner always gives (weight
    1, masquerade, as kube-proxy programs them): the planner's mappings hold each key as its own
    value, so a wanted real server is no object beyond its key (RealServer is for settings of
    their own: read back from the kernel, or drained at weight 0).
    """

    address: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.address}]" if is_ipv6(self.address) else self.address
        return f"{host}:{self.port}"

    @property
    def key(self) -> DestKey:
        return self

    @property
    def weight(self) -> int:
        return 1

    @property
    def fwd_method(self) -> int:
        return FWD_MASQ

    def same_settings(self, other: RealServerLike) -> bool:
        return other.weight == 1 and other.fwd_method == FWD_MASQ

    @property
    def server(self) -> DestKey:
        return self

    @property
    def stats(self) -> DestStats:
        return IDLE


# A DestKey from an (address, port) tuple, built in C: a named tuple's own __new__ is a
# Python function, and the planner makes a key per endpoint and port.
new_dest_key = partial(tuple.__new__, DestKey)


@dataclass(frozen=True, slots=True)
class RealServer:
    key: DestKey
    weight: int = 1
    fwd_method: int = FWD_MASQ

    def same_settings(self, other: RealServerLike) -> bool:
        return self.weight == other.weight and self.fwd_method == other.fwd_method

    # A real server ipvsproxy programmed and has not read back is its own observed state,
    # with no connections known (what ObservedDest(server) would say). The observed cache
    # holds it as it is: an ObservedDest wraps only a real server the kernel reported.
    @property
    def server(self) -> RealServer:
        return self

    @property
    def stats(self) -> DestStats:
        return IDLE


@dataclass(frozen=True, slots=True)
class DestStats:
    """Connection counters the kernel reports for a real server (observed only)."""

    active: int = 0
    inactive: int = 0
    persistent: int = 0

    @property
    def idle(self) -> bool:
        return self.active == 0 and self.inactive == 0


IDLE = DestStats()


@dataclass(frozen=True, slots=True)
class Traffic:
    """Packet, byte and connection counters and rates of a virtual or real server, as
    ``ipvsadm --stats`` and ``--rate`` show them (observed only; for ``ipvsproxy status``)."""

    connections: int = 0
    in_packets: int = 0
    out_packets: int = 0
    in_bytes: int = 0
    out_bytes: int = 0
    cps: int = 0
    in_pps: int = 0
    out_pps: int = 0
    in_bps: int = 0
    out_bps: int = 0


@dataclass(frozen=True, slots=True)
class ObservedDest:
    server: RealServerLike
    stats: DestStats = IDLE  # immutable, so one instance serves every default


# A real server with settings of its own, or with the planner's (its key: see DestKey).
RealServerLike = RealServer | DestKey

# A real server as the kernel reported it, or as ipvsproxy programmed it (see RealServer).
Seen = ObservedDest | RealServer | DestKey
