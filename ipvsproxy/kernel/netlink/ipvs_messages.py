"""IPVS generic-netlink messages (include/uapi/linux/ip_vs.h), built and parsed with struct.

Checked against pyroute2's codec on the same messages in tests/unit/test_ipvs_codec.py.
"""

from __future__ import annotations

import socket
import struct

from ipvsproxy.core.virtual_servers import (
    FWD_MASQ,
    DestKey,
    DestStats,
    ObservedDest,
    Protocol,
    RealServer,
    RealServerLike,
    ServiceKey,
    Traffic,
    VirtualServer,
    is_ipv6,
)
from ipvsproxy.kernel.netlink import codec

GENL_NAME = "IPVS"
GENL_VERSION = 1

CMD_NEW_SERVICE = 1
CMD_SET_SERVICE = 2
CMD_DEL_SERVICE = 3
CMD_GET_SERVICE = 4
CMD_NEW_DEST = 5
CMD_SET_DEST = 6
CMD_DEL_DEST = 7
CMD_GET_DEST = 8
CMD_SET_CONFIG = 12
CMD_GET_CONFIG = 13
CMD_FLUSH = 17

ATTR_SERVICE = 1
ATTR_DEST = 2
ATTR_TIMEOUT_TCP = 4
ATTR_TIMEOUT_TCP_FIN = 5
ATTR_TIMEOUT_UDP = 6

SVC_AF = 1
SVC_PROTOCOL = 2
SVC_ADDR = 3
SVC_PORT = 4
SVC_FWMARK = 5
SVC_SCHED_NAME = 6
SVC_FLAGS = 7
SVC_TIMEOUT = 8
SVC_NETMASK = 9
SVC_STATS = 10
SVC_STATS64 = 12

DEST_ADDR = 1
DEST_PORT = 2
DEST_FWD_METHOD = 3
DEST_WEIGHT = 4
DEST_U_THRESH = 5
DEST_L_THRESH = 6
DEST_ACTIVE_CONNS = 7
DEST_INACT_CONNS = 8
DEST_PERSIST_CONNS = 9
DEST_STATS = 10
DEST_ADDR_FAMILY = 11
DEST_STATS64 = 12

# Inside a stats attribute (enum ip_vs_stats_attrs), in the order of Traffic's fields; the
# 64-bit variant carries every counter as u64, the old one u32 but for the byte counts.
_STATS_FIELDS = (
    "connections",
    "in_packets",
    "out_packets",
    "in_bytes",
    "out_bytes",
    "cps",
    "in_pps",
    "out_pps",
    "in_bps",
    "out_bps",
)

_FLAGS = struct.Struct("=II")
_BE16 = struct.Struct("!H")
# A nested IPVS_CMD_ATTR_DEST with address, port, forwarding method, weight, both thresholds
# and address family, each attribute header and padding in place: what _dest_full encodes,
# the same bytes as codec.nested() of codec.attr*() each, in one call.
_DEST_FULL = struct.Struct("=HH" + "HH16s" + "HH2s2x" + "HHI" * 4 + "HHH2x")
# A virtual server's address family, protocol, address and port, and its flags (with their
# mask), timeout and netmask: each attribute header and padding in place, the same bytes as
# codec.attr*() of each, in one call.
_SVC_ID = struct.Struct("=HHH2x" + "HHH2x" + "HH16s" + "HH2s2x")
_SVC_TAIL = struct.Struct("=HHII" + "HHI" + "HHI")
_REQ_ACK = codec.NLM_F_REQUEST | codec.NLM_F_ACK
_GENL_HEAD = struct.Struct("=IHHIIBBH")  # nlmsghdr + genlmsghdr, as codec.genl_message packs
_REQ_DUMP = codec.NLM_F_REQUEST | codec.NLM_F_DUMP


def _family(address: str) -> int:
    return socket.AF_INET6 if is_ipv6(address) else socket.AF_INET


def _addr16(address: str) -> bytes:
    """The kernel's union nf_inet_addr: 16 bytes whatever the family, as ipvsadm sends it."""
    fam = _family(address)
    return socket.inet_pton(fam, address).ljust(16, b"\0")


def _service_id(key: ServiceKey) -> bytes:
    """Address family, protocol, address and port (see ``_SVC_ID``)."""
    address = key.address
    family = _family(address)
    return _SVC_ID.pack(
        6,
        SVC_AF,
        family,
        6,
        SVC_PROTOCOL,
        key.protocol.number,
        20,
        SVC_ADDR,
        socket.inet_pton(family, address),  # "16s" pads an IPv4 address with zeros
        6,
        SVC_PORT,
        _BE16.pack(key.port),
    )


def _netmask(vs: VirtualServer) -> int:
    if is_ipv6(vs.key.address):
        return vs.prefix_len
    bits = vs.prefix_len
    mask = (0xFFFFFFFF << (32 - bits)) & 0xFFFFFFFF if bits else 0
    # The kernel reads the IPv4 netmask as a big-endian u32.
    value: int = struct.unpack("=I", struct.pack("!I", mask))[0]
    return value


def _service_full(vs: VirtualServer) -> bytes:
    tail = _SVC_TAIL.pack(
        12,
        SVC_FLAGS,
        vs.flags,
        0xFFFFFFFF,
        8,
        SVC_TIMEOUT,
        vs.timeout,
        8,
        SVC_NETMASK,
        _netmask(vs),
    )
    return _service_id(vs.key) + codec.attr_str(SVC_SCHED_NAME, vs.scheduler) + tail


def _dest_full(rs: RealServerLike) -> bytes:
    """A nested destination attribute with every setting (see ``_DEST_FULL``)."""
    if type(rs) is DestKey:  # the planner's: weight 1, masquerade, read without properties
        (addr, port), fwd_method, weight = rs, FWD_MASQ, 1
    else:
        (addr, port), fwd_method, weight = rs.key, rs.fwd_method, rs.weight
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    return _DEST_FULL.pack(
        _DEST_FULL.size,
        ATTR_DEST | codec.NLA_F_NESTED,
        20,
        DEST_ADDR,
        socket.inet_pton(family, addr),  # "16s" pads an IPv4 address with zeros
        6,
        DEST_PORT,
        _BE16.pack(port),
        8,
        DEST_FWD_METHOD,
        fwd_method,
        8,
        DEST_WEIGHT,
        weight,
        8,
        DEST_U_THRESH,
        0,
        8,
        DEST_L_THRESH,
        0,
        6,
        DEST_ADDR_FAMILY,
        family,
    )


class Encoder:
    """Builds requests for one IPVS family id; the caller numbers them (seq)."""

    def __init__(self, family_id: int) -> None:
        self.family_id = family_id
        # The service part of destination messages repeats for every real server of a
        # virtual server: keep the last one encoded.
        self._svc_key: ServiceKey | None = None
        self._svc_attr = b""

    def _msg(self, cmd: int, seq: int, body: bytes, flags: int = _REQ_ACK) -> bytes:
        return codec.genl_message(self.family_id, cmd, GENL_VERSION, seq, flags, body)

    def new_service(self, seq: int, vs: VirtualServer) -> bytes:
        return self._msg(CMD_NEW_SERVICE, seq, codec.nested(ATTR_SERVICE, _service_full(vs)))

    def set_service(self, seq: int, vs: VirtualServer) -> bytes:
        return self._msg(CMD_SET_SERVICE, seq, codec.nested(ATTR_SERVICE, _service_full(vs)))

    def del_service(self, seq: int, key: ServiceKey) -> bytes:
        return self._msg(CMD_DEL_SERVICE, seq, codec.nested(ATTR_SERVICE, _service_id(key)))

    def _service_attr(self, key: ServiceKey) -> bytes:
        if key is not self._svc_key and key != self._svc_key:
            self._svc_key = key
            self._svc_attr = codec.nested(ATTR_SERVICE, _service_id(key))
        return self._svc_attr

    def new_dest(self, seq: int, key: ServiceKey, rs: RealServerLike) -> bytes:
        """The hot path of a cold sync (one per real server): what ``_msg`` would build, with
        its calls folded in; the same bytes."""
        svc = self._svc_attr if key is self._svc_key else self._service_attr(key)
        dest = _dest_full(rs)
        return (
            _GENL_HEAD.pack(
                codec.HEADER_LEN + len(svc) + len(dest),
                self.family_id,
                _REQ_ACK,
                seq,
                0,
                CMD_NEW_DEST,
                GENL_VERSION,
                0,
            )
            + svc
            + dest
        )

    def set_dest(self, seq: int, key: ServiceKey, rs: RealServerLike) -> bytes:
        return self._msg(CMD_SET_DEST, seq, self._service_attr(key) + _dest_full(rs))

    def del_dest(self, seq: int, key: ServiceKey, dest: DestKey) -> bytes:
        body = codec.nested(
            ATTR_DEST,
            codec.attr(DEST_ADDR, _addr16(dest.address))
            + codec.attr_be16(DEST_PORT, dest.port)
            + codec.attr_u16(DEST_ADDR_FAMILY, _family(dest.address)),
        )
        return self._msg(CMD_DEL_DEST, seq, self._service_attr(key) + body)

    def dump_services(self, seq: int) -> bytes:
        return self._msg(CMD_GET_SERVICE, seq, b"", _REQ_DUMP)

    def get_service(self, seq: int, key: ServiceKey) -> bytes:
        """One virtual server by its key (the kernel answers ESRCH when there is none)."""
        return self._msg(CMD_GET_SERVICE, seq, self._service_attr(key), codec.NLM_F_REQUEST)

    def dump_dests(self, seq: int, key: ServiceKey) -> bytes:
        return self._msg(CMD_GET_DEST, seq, self._service_attr(key), _REQ_DUMP)

    def get_config(self, seq: int) -> bytes:
        return self._msg(CMD_GET_CONFIG, seq, b"", codec.NLM_F_REQUEST)

    def set_config(self, seq: int, tcp: int, tcp_fin: int, udp: int) -> bytes:
        body = (
            codec.attr_u32(ATTR_TIMEOUT_TCP, tcp)
            + codec.attr_u32(ATTR_TIMEOUT_TCP_FIN, tcp_fin)
            + codec.attr_u32(ATTR_TIMEOUT_UDP, udp)
        )
        return self._msg(CMD_SET_CONFIG, seq, body)


def _addr_text(data: bytes, span: tuple[int, int], family: int) -> str:
    raw = codec.get_bytes(data, span)
    return socket.inet_ntop(family, raw[:4] if family == socket.AF_INET else raw[:16])


def _prefix_len(mask: int, family: int) -> int:
    if family == socket.AF_INET6:
        return mask
    return bin(struct.unpack("!I", struct.pack("=I", mask))[0]).count("1")


def parse_config(msg: codec.Message) -> tuple[int, int, int]:
    """The timeouts (tcp, tcpfin, udp) of the kernel's GET_CONFIG reply, in seconds."""
    top = msg.attrs()
    try:
        return (
            codec.get_u32(msg.data, top[ATTR_TIMEOUT_TCP]),
            codec.get_u32(msg.data, top[ATTR_TIMEOUT_TCP_FIN]),
            codec.get_u32(msg.data, top[ATTR_TIMEOUT_UDP]),
        )
    except KeyError as exc:
        raise ValueError(f"IPVS config reply without timeout attribute {exc}") from None


def parse_service(msg: codec.Message) -> VirtualServer | None:
    """A virtual server from a NEW_SERVICE dump message; None for fwmark services."""
    top = msg.attrs()
    span = top.get(ATTR_SERVICE)
    if span is None:
        return None
    data = msg.data
    a = codec.attrs_of(data, span[0], span[1])
    if SVC_ADDR not in a or (SVC_FWMARK in a and codec.get_u32(data, a[SVC_FWMARK])):
        return None
    family = codec.get_u16(data, a[SVC_AF])
    try:
        proto = Protocol.from_number(codec.get_u16(data, a[SVC_PROTOCOL]))
    except ValueError:
        return None
    key = ServiceKey(
        _addr_text(data, a[SVC_ADDR], family), proto, codec.get_be16(data, a[SVC_PORT])
    )
    flags = _FLAGS.unpack_from(data, a[SVC_FLAGS][0])[0] if SVC_FLAGS in a else 0
    return VirtualServer(
        key=key,
        scheduler=codec.get_str(data, a[SVC_SCHED_NAME]) if SVC_SCHED_NAME in a else "",
        flags=flags,
        timeout=codec.get_u32(data, a[SVC_TIMEOUT]) if SVC_TIMEOUT in a else 0,
        netmask=_prefix_len(codec.get_u32(data, a[SVC_NETMASK]), family)
        if SVC_NETMASK in a
        else -1,
    )


def parse_dest(msg: codec.Message, service_family: int) -> ObservedDest | None:
    span = msg.attrs().get(ATTR_DEST)
    if span is None:
        return None
    data = msg.data
    a = codec.attrs_of(data, span[0], span[1])
    family = codec.get_u16(data, a[DEST_ADDR_FAMILY]) if DEST_ADDR_FAMILY in a else service_family
    key = DestKey(_addr_text(data, a[DEST_ADDR], family), codec.get_be16(data, a[DEST_PORT]))

    def u32(kind: int) -> int:
        return codec.get_u32(data, a[kind]) if kind in a else 0

    return ObservedDest(
        RealServer(key, weight=u32(DEST_WEIGHT), fwd_method=u32(DEST_FWD_METHOD) & 0x7),
        DestStats(u32(DEST_ACTIVE_CONNS), u32(DEST_INACT_CONNS), u32(DEST_PERSIST_CONNS)),
    )


def _traffic(data: bytes, a: dict[int, tuple[int, int]], stats64: int, stats: int) -> Traffic:
    span, wide = (a[stats64], True) if stats64 in a else (a.get(stats), False)
    if span is None:
        return Traffic()
    values: dict[str, int] = {}
    for kind, sub in codec.iter_attrs(data, span[0], span[1]):
        if 1 <= kind <= len(_STATS_FIELDS):
            name = _STATS_FIELDS[kind - 1]
            u64 = wide or name.endswith("_bytes")
            values[name] = codec.get_u64(data, sub) if u64 else codec.get_u32(data, sub)
    return Traffic(**values)


def service_traffic(msg: codec.Message) -> Traffic:
    """The counters of a NEW_SERVICE dump message (read only by ``ipvsproxy status``)."""
    span = msg.attrs().get(ATTR_SERVICE)
    if span is None:
        return Traffic()
    a = codec.attrs_of(msg.data, span[0], span[1])
    return _traffic(msg.data, a, SVC_STATS64, SVC_STATS)


def dest_traffic(msg: codec.Message) -> Traffic:
    span = msg.attrs().get(ATTR_DEST)
    if span is None:
        return Traffic()
    a = codec.attrs_of(msg.data, span[0], span[1])
    return _traffic(msg.data, a, DEST_STATS64, DEST_STATS)


def family_of(key: ServiceKey) -> int:
    return _family(key.address)
