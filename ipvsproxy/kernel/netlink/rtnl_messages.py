"""rtnetlink address messages (RTM_NEWADDR / DELADDR / GETADDR), built and parsed with struct,
and the one link message ipvsproxy sends (RTM_NEWLINK of its dummy device).

A cold sync binds one address per Service to kube-ipvs0: thousands of them, so they go in
batches like the IPVS messages do.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from ipvsproxy.core.virtual_servers import is_ipv6
from ipvsproxy.kernel.netlink import codec

RTM_NEWLINK = 16
RTM_NEWADDR = 20
RTM_DELADDR = 21
RTM_GETADDR = 22
IFLA_IFNAME = 3
IFLA_LINKINFO = 18
IFLA_INFO_KIND = 1
IFA_ADDRESS = 1
IFA_LOCAL = 2
IFA_LABEL = 3
NLM_F_CREATE = 0x400
NLM_F_EXCL = 0x200
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_HOST = 254
RTMGRP_IPV4_IFADDR = 0x10  # the multicast group of IPv4 address notices
RTMGRP_IPV6_IFADDR = 0x100  # and of IPv6 ones
IFA_F_NODAD = 0x02  # an IPv6 address usable at once: no duplicate-address detection

_NLMSGHDR = struct.Struct("=IHHII")
_IFADDRMSG = struct.Struct("=BBBBI")
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change


@dataclass(frozen=True, slots=True)
class InterfaceAddress:
    ifindex: int
    address: str
    prefixlen: int
    scope: int


def _message(kind: int, seq: int, flags: int, body: bytes) -> bytes:
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, seq, 0) + body


def _ifaddr(ifindex: int, address: str) -> bytes:
    family = socket.AF_INET6 if is_ipv6(address) else socket.AF_INET
    raw = socket.inet_pton(family, address)
    prefix = 128 if family == socket.AF_INET6 else 32
    # A service address is usable at once: never tentative while duplicate-address detection
    # probes the link (a dummy device's NOARP skips it too; nodad says so whatever the device).
    flags = IFA_F_NODAD if family == socket.AF_INET6 else 0
    head = _IFADDRMSG.pack(family, prefix, flags, RT_SCOPE_UNIVERSE, ifindex)
    return head + codec.attr(IFA_LOCAL, raw) + codec.attr(IFA_ADDRESS, raw)


def new_link(seq: int, name: str, kind: str) -> bytes:
    """Create a link of ``kind`` (``ip link add NAME type KIND``), left down."""
    body = (
        _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        + codec.attr_str(IFLA_IFNAME, name)
        + codec.nested(IFLA_LINKINFO, codec.attr_str(IFLA_INFO_KIND, kind))
    )
    flags = codec.NLM_F_REQUEST | codec.NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    return _message(RTM_NEWLINK, seq, flags, body)


def add_address(seq: int, ifindex: int, address: str) -> bytes:
    flags = codec.NLM_F_REQUEST | codec.NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL
    return _message(RTM_NEWADDR, seq, flags, _ifaddr(ifindex, address))


def del_address(seq: int, ifindex: int, address: str) -> bytes:
    flags = codec.NLM_F_REQUEST | codec.NLM_F_ACK
    return _message(RTM_DELADDR, seq, flags, _ifaddr(ifindex, address))


def dump_addresses(seq: int, family: int = socket.AF_UNSPEC) -> bytes:
    flags = codec.NLM_F_REQUEST | codec.NLM_F_DUMP
    return _message(RTM_GETADDR, seq, flags, _IFADDRMSG.pack(family, 0, 0, 0, 0))


def address_event_ifindex(msg: codec.Message) -> int | None:
    """The interface of an address notice (RTM_NEWADDR / RTM_DELADDR); None for others. Only the
    header is read: a cold sync's thousands of kube-ipvs0 notices cost little."""
    if msg.type not in (RTM_NEWADDR, RTM_DELADDR) or msg.end - msg.start < _IFADDRMSG.size:
        return None
    ifindex: int = _IFADDRMSG.unpack_from(msg.data, msg.start)[4]
    return ifindex


def parse_address(msg: codec.Message) -> InterfaceAddress | None:
    if msg.type != RTM_NEWADDR:
        return None
    family, prefixlen, _flags, scope, ifindex = _IFADDRMSG.unpack_from(msg.data, msg.start)
    attrs = codec.attrs_of(msg.data, msg.start + _IFADDRMSG.size, msg.end)
    span = attrs.get(IFA_LOCAL) or attrs.get(IFA_ADDRESS)
    if span is None or family not in (socket.AF_INET, socket.AF_INET6):
        return None
    address = socket.inet_ntop(family, codec.get_bytes(msg.data, span))
    return InterfaceAddress(ifindex, address, prefixlen, scope)
