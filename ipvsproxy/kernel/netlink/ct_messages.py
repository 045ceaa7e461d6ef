"""ctnetlink (nfnetlink's conntrack subsystem) messages with struct: a dump request filtered in
the kernel by the original tuple's destination, protocol and port; an entry as read; its
delete; and (for the lab's tests) an entry to create. Pure: no sockets here.

The kernel (5.8 and later) applies a dump's CTA_FILTER to the CTA_TUPLE_ORIG given beside it,
matching only the fields its flags name (net/netfilter/nf_conntrack_netlink.c,
``ctnetlink_filter_match_tuple``). In 6.1 the IPv6 address comparison there is inverted
(``!ipv6_addr_cmp``: an IPv6 address filter matches every entry but those to that address),
so an IPv6 dump is filtered in the kernel by protocol and port only, and by address here.
"""

from __future__ import annotations

import socket
import struct
from typing import NamedTuple

from ipvsproxy.kernel.netlink import codec

NFNL_SUBSYS_CTNETLINK = 1
IPCTNL_MSG_CT_NEW = 0
IPCTNL_MSG_CT_GET = 1
IPCTNL_MSG_CT_DELETE = 2

CTA_TUPLE_ORIG = 1
CTA_TUPLE_REPLY = 2
CTA_STATUS = 3
CTA_TIMEOUT = 7
CTA_ID = 12
CTA_ZONE = 18
CTA_FILTER = 25
CTA_TUPLE_IP = 1
CTA_TUPLE_PROTO = 2
CTA_PROTO_NUM = 1
CTA_PROTO_SRC_PORT = 2
CTA_PROTO_DST_PORT = 3
CTA_FILTER_ORIG_FLAGS = 1
# Filter flags: which fields of the given tuple an entry must match (CTA_FILTER_F_*).
FILTER_IP_DST = 1 << 1
FILTER_PROTO_NUM = 1 << 3
FILTER_PROTO_DST_PORT = 1 << 5

_HEAD = struct.Struct("=IHHIIBBH")  # nlmsghdr + nfgenmsg (family, version 0, res_id 0)
_BE16 = struct.Struct("!H")
_IP_ATTRS: dict[int, tuple[int, int]] = {
    socket.AF_INET: (1, 2),
    socket.AF_INET6: (3, 4),
}  # CTA_IP_V{4,6}_{SRC,DST}


class Flow(NamedTuple):
    """One conntrack entry as read: its original tuple's protocol, destination (address,
    port), the reply tuple's source (the real server that answers it, or the destination
    itself when never NATed), and the raw attributes that name it for a delete."""

    protocol: int
    destination: tuple[str, int]
    answered_by: tuple[str, int]
    key: bytes  # CTA_TUPLE_ORIG, CTA_ID and CTA_ZONE as read, whole attributes


def _message(kind: int, flags: int, family: int, seq: int, body: bytes) -> bytes:
    msg_type = (NFNL_SUBSYS_CTNETLINK << 8) | kind
    return _HEAD.pack(_HEAD.size + len(body), msg_type, flags, seq, 0, family, 0, 0) + body


def _tuple(
    family: int, src: str | None, dst: str | None, proto: int, sport: int | None, dport: int | None
) -> bytes:
    src_attr, dst_attr = _IP_ATTRS[family]
    ips = b""
    if src is not None:
        ips += codec.attr(src_attr, socket.inet_pton(family, src))
    if dst is not None:
        ips += codec.attr(dst_attr, socket.inet_pton(family, dst))
    ports = codec.attr(CTA_PROTO_NUM, bytes([proto]))
    if sport is not None:
        ports += codec.attr_be16(CTA_PROTO_SRC_PORT, sport)
    if dport is not None:
        ports += codec.attr_be16(CTA_PROTO_DST_PORT, dport)
    ip_part = codec.nested(CTA_TUPLE_IP, ips) if ips else b""
    return ip_part + codec.nested(CTA_TUPLE_PROTO, ports)


def dump_request(family: int, seq: int, address: str | None, port: int, proto: int) -> bytes:
    """A dump of the entries whose original tuple goes to ``port`` over ``proto``, filtered
    in the kernel by both, and by ``address`` too when given for IPv4 (for IPv6 it is left to
    the caller: see the module's docstring)."""
    flags = FILTER_PROTO_NUM | FILTER_PROTO_DST_PORT
    dst: str | None = None
    if address is not None and family == socket.AF_INET:
        flags |= FILTER_IP_DST
        dst = address
    body = codec.nested(CTA_TUPLE_ORIG, _tuple(family, None, dst, proto, None, port))
    body += codec.nested(CTA_FILTER, codec.attr_u32(CTA_FILTER_ORIG_FLAGS, flags))
    request = codec.NLM_F_REQUEST | codec.NLM_F_DUMP
    return _message(IPCTNL_MSG_CT_GET, request, family, seq, body)


def delete_request(family: int, seq: int, flow: Flow) -> bytes:
    """Delete the entry ``flow`` was read from, and no other: with its CTA_ID, a new entry of
    the same tuple is refused (ENOENT). A delete without a tuple would flush the whole
    table: a flow not read from the kernel (no ``key``) is refused here."""
    if not flow.key:
        raise ValueError(f"no conntrack entry to delete: {flow}")
    flags = codec.NLM_F_REQUEST | codec.NLM_F_ACK
    return _message(IPCTNL_MSG_CT_DELETE, flags, family, seq, flow.key)


def create_request(
    family: int,
    seq: int,
    orig: tuple[str, int, str, int],
    reply: tuple[str, int, str, int],
    timeout: int = 120,
) -> bytes:
    """A UDP entry (src, sport, dst, dport) each way, for ``timeout`` seconds: for the lab's
    tests and benchmarks."""
    udp = socket.IPPROTO_UDP
    body = codec.nested(CTA_TUPLE_ORIG, _tuple(family, orig[0], orig[2], udp, orig[1], orig[3]))
    body += codec.nested(
        CTA_TUPLE_REPLY, _tuple(family, reply[0], reply[2], udp, reply[1], reply[3])
    )
    body += codec.attr(CTA_TIMEOUT, struct.pack("!I", timeout))
    flags = codec.NLM_F_REQUEST | codec.NLM_F_ACK | 0x400  # NLM_F_CREATE
    return _message(IPCTNL_MSG_CT_NEW, flags, family, seq, body)


def _endpoints(data: bytes, span: tuple[int, int]) -> tuple[int, str, int, str, int]:
    """A tuple attribute's (protocol, source, source port, destination, destination port)."""
    parts = codec.attrs_of(data, *span)
    ips = codec.attrs_of(data, *parts[CTA_TUPLE_IP])
    ports = codec.attrs_of(data, *parts[CTA_TUPLE_PROTO])
    if 1 in ips:
        family, src, dst = socket.AF_INET, ips[1], ips[2]
    else:
        family, src, dst = socket.AF_INET6, ips[3], ips[4]
    proto = data[ports[CTA_PROTO_NUM][0]]
    sport = codec.get_be16(data, ports[CTA_PROTO_SRC_PORT]) if CTA_PROTO_SRC_PORT in ports else 0
    dport = codec.get_be16(data, ports[CTA_PROTO_DST_PORT]) if CTA_PROTO_DST_PORT in ports else 0
    source = socket.inet_ntop(family, data[src[0] : src[1]])
    destination = socket.inet_ntop(family, data[dst[0] : dst[1]])
    return proto, source, sport, destination, dport


def flow(msg: codec.Message) -> Flow | None:
    """The entry of one dump message; None for one without both tuples' addresses."""
    data = msg.data
    attrs = msg.attrs()
    try:
        proto, _src, _sport, dst, dport = _endpoints(data, attrs[CTA_TUPLE_ORIG])
        _p, reply_src, reply_sport, _dst, _dport = _endpoints(data, attrs[CTA_TUPLE_REPLY])
    except (KeyError, IndexError, ValueError, struct.error):
        return None
    key = b"".join(
        _whole(data, attrs[kind]) for kind in (CTA_TUPLE_ORIG, CTA_ID, CTA_ZONE) if kind in attrs
    )
    return Flow(proto, (dst, dport), (reply_src, reply_sport), key)


def _whole(data: bytes, span: tuple[int, int]) -> bytes:
    """An attribute, header included, from its payload's span (padded as sent)."""
    start = span[0] - 4
    return data[start : start + ((span[1] - start + 3) & ~3)]
