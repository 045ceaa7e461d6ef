"""ipset requests over nfnetlink (include/uapi/linux/netfilter/ipset/ip_set.h): members added
and deleted in batches with every endpoint change, sets listed and created.

A set is created with the newest revision of its type the kernel has, asked for first, as the
ipset tool does. (Destroying sets, only ever done by ``ipvsproxy cleanup``, goes through
pyroute2.)
"""

from __future__ import annotations

import functools
import socket
import struct
from collections.abc import Container, Mapping

from ipvsproxy.kernel.netlink import codec

NFNL_SUBSYS_IPSET = 6
IPSET_PROTOCOL = 6
CMD_CREATE = 2
CMD_LIST = 7
CMD_ADD = 9
CMD_DEL = 10
CMD_TYPE = 13
NLM_F_EXCL = 0x200
NLA_F_NET_BYTEORDER = 0x4000

ATTR_PROTOCOL = 1
ATTR_SETNAME = 2
ATTR_TYPENAME = 3
ATTR_REVISION = 4
ATTR_FAMILY = 5
ATTR_DATA = 7
ATTR_ADT = 8
ATTR_LINENO = 9
DATA_IP = 1
DATA_CIDR = 3
DATA_PORT = 4
DATA_PORT_TO = 5
DATA_PROTO = 7
DATA_HASHSIZE = 18
DATA_MAXELEM = 19
DATA_IP2 = 20
DATA_CIDR2 = 21
IPADDR_IPV4 = 1
IPADDR_IPV6 = 2

_NLMSGHDR = struct.Struct("=IHHII")
_NFGENMSG = struct.Struct("=BBH")
_PROTOS = {"tcp": 6, "udp": 17, "sctp": 132}
_PROTO_NAMES = {v: k for k, v in _PROTOS.items()}

# ipset's own error numbers (IPSET_ERR_*), which the kernel returns as negative errnos.
ERRORS = {
    4097: "protocol error",
    4098: "set type not supported",
    4099: "too many sets",
    4100: "set is in use",
    4102: "type mismatch",
    4103: "element already exists",
    4104: "invalid CIDR",
    4106: "invalid family",
    4108: "set is referenced",
    4109: "invalid IPv4 address",
    4352: "element not in set / set-type specific error",
    4353: "set is full",
}


# Attributes with their headers and padding, each in one call (the bytes codec.attr() and
# codec.nested() would build): an IPv4 address nested in its own attribute, a big-endian port,
# a u8.
_IP_ATTR = struct.Struct("=HHHH4s")
_IP6_ATTR = struct.Struct("=HHHH16s")
_PORT_ATTR = struct.Struct("=HH2s2x")
_U8_ATTR = struct.Struct("=HH1s3x")
_BE16 = struct.Struct("!H")
_BE32_ATTR = struct.Struct("=HH4s")


def _ip(kind: int, address: str) -> bytes:
    if ":" in address:
        raw = socket.inet_pton(socket.AF_INET6, address)
        return _IP6_ATTR.pack(
            _IP6_ATTR.size, kind | codec.NLA_F_NESTED, 20, IPADDR_IPV6 | NLA_F_NET_BYTEORDER, raw
        )
    raw = socket.inet_pton(socket.AF_INET, address)
    return _IP_ATTR.pack(
        _IP_ATTR.size, kind | codec.NLA_F_NESTED, 8, IPADDR_IPV4 | NLA_F_NET_BYTEORDER, raw
    )


def _port(port: int, kind: int = DATA_PORT) -> bytes:
    return _PORT_ATTR.pack(6, kind | NLA_F_NET_BYTEORDER, _BE16.pack(port))


def _be32(kind: int, value: int) -> bytes:
    return _BE32_ATTR.pack(8, kind | NLA_F_NET_BYTEORDER, value.to_bytes(4, "big"))


def _u8(kind: int, value: int) -> bytes:
    return _U8_ATTR.pack(5, kind, bytes([value]))


def entry_data(set_type: str, entry: str) -> bytes:
    """The IPSET_ATTR_DATA payload for one member in ipset's text form."""
    if set_type == "bitmap:port":
        return _port(int(entry))
    if set_type == "hash:ip":
        return _ip(DATA_IP, entry)
    parts = entry.split(",")
    proto, _, port = parts[1].partition(":")
    body = _ip(DATA_IP, parts[0]) + _port(int(port)) + _u8(DATA_PROTO, _PROTOS[proto])
    if set_type == "hash:ip,port":
        return body
    if set_type == "hash:ip,port,ip":
        return body + _ip(DATA_IP2, parts[2])
    if set_type == "hash:ip,port,net":
        net, _, prefix = parts[2].partition("/")
        full = 128 if ":" in net else 32
        return body + _ip(DATA_IP2, net) + _u8(DATA_CIDR2, int(prefix or full))
    raise ValueError(f"unsupported ipset type {set_type}")


@functools.lru_cache(maxsize=64)
def _head(set_name: str) -> bytes:
    """The part of a member request before its data, the same for every member of a set."""
    return (
        _NFGENMSG.pack(socket.AF_INET, 0, 0)
        + _u8(ATTR_PROTOCOL, IPSET_PROTOCOL)
        + codec.attr_str(ATTR_SETNAME, set_name)
    )


_WRITE_FLAGS = codec.NLM_F_REQUEST | codec.NLM_F_ACK | NLM_F_EXCL


def member_message(seq: int, add: bool, set_name: str, set_type: str, entry: str) -> bytes:
    body = _head(set_name) + codec.nested(ATTR_DATA, entry_data(set_type, entry))
    kind = (NFNL_SUBSYS_IPSET << 8) | (CMD_ADD if add else CMD_DEL)
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, _WRITE_FLAGS, seq, 0) + body


def _request(cmd: int, seq: int, flags: int, attrs: bytes) -> bytes:
    body = _NFGENMSG.pack(socket.AF_INET, 0, 0) + _u8(ATTR_PROTOCOL, IPSET_PROTOCOL) + attrs
    kind = (NFNL_SUBSYS_IPSET << 8) | cmd
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, seq, 0) + body


def type_request(seq: int, set_type: str, family: int = socket.AF_INET) -> bytes:
    """Which revisions of ``set_type`` the kernel has for ``family`` (loading its module if
    need be)."""
    attrs = codec.attr_str(ATTR_TYPENAME, set_type) + _u8(ATTR_FAMILY, family)
    return _request(CMD_TYPE, seq, codec.NLM_F_REQUEST, attrs)


def newest_revision(msg: codec.Message) -> int:
    """The newest revision in the kernel's answer to ``type_request``."""
    span = msg.attrs().get(ATTR_REVISION)
    if span is None:
        raise ValueError("the kernel named no revision of the set type")
    return msg.data[span[0]]


def create_request(
    seq: int, set_name: str, set_type: str, revision: int, family: int = socket.AF_INET
) -> bytes:
    """Create a set of ``family`` (AF_INET or AF_INET6; a bitmap:port set, of ports only, is
    created as AF_INET whatever its use: the kernel's type takes any family) with upstream
    kube-proxy's parameters: a bitmap over every port, hashes of 1024 buckets holding up to
    65536 members. Fails (EEXIST) if the set exists."""
    if set_type == "bitmap:port":
        data = _port(0, DATA_PORT) + _port(65535, DATA_PORT_TO)
    else:
        data = _be32(DATA_HASHSIZE, 1024) + _be32(DATA_MAXELEM, 65536)
    attrs = (
        codec.attr_str(ATTR_SETNAME, set_name)
        + codec.attr_str(ATTR_TYPENAME, set_type)
        + _u8(ATTR_REVISION, revision)
        + _u8(ATTR_FAMILY, socket.AF_INET if set_type.startswith("bitmap:") else family)
        + codec.nested(ATTR_DATA, data)
    )
    return _request(CMD_CREATE, seq, _WRITE_FLAGS, attrs)


def list_request(seq: int) -> bytes:
    """Dump every set with its members (what ``ipset list`` asks for)."""
    return _request(CMD_LIST, seq, codec.NLM_F_REQUEST | codec.NLM_F_DUMP, b"")


def _address(data: bytes, span: tuple[int, int]) -> str:
    """An address nested in its IPADDR attribute, IPv4 or IPv6."""
    inner = codec.attrs_of(data, span[0], span[1])
    if IPADDR_IPV6 in inner:
        return socket.inet_ntop(socket.AF_INET6, codec.get_bytes(data, inner[IPADDR_IPV6])[:16])
    return socket.inet_ntop(socket.AF_INET, codec.get_bytes(data, inner[IPADDR_IPV4])[:4])


# The member shapes of ipvsproxy's set types, the only ones decoded.
SHAPES = frozenset(
    {"bitmap:port", "hash:ip", "hash:ip,port", "hash:ip,port,ip", "hash:ip,port,net"}
)


def entry_text(set_type: str, data: bytes, span: tuple[int, int]) -> str | None:
    """One member (an IPSET_ATTR_DATA of a list reply) in ipset's text form; None for a member
    not of one of ``SHAPES`` (another type, or an attribute missing), which is skipped."""
    if set_type not in SHAPES:
        return None
    try:
        return _entry_text(set_type, data, codec.attrs_of(data, span[0], span[1]))
    except (KeyError, IndexError, struct.error, ValueError):
        return None


def _entry_text(set_type: str, data: bytes, a: dict[int, tuple[int, int]]) -> str:
    if set_type == "bitmap:port":
        return str(struct.unpack_from("!H", data, a[DATA_PORT][0])[0])
    ip = _address(data, a[DATA_IP])
    if set_type == "hash:ip":
        return ip
    port = struct.unpack_from("!H", data, a[DATA_PORT][0])[0]
    proto_num = data[a[DATA_PROTO][0]]
    text = f"{ip},{_PROTO_NAMES.get(proto_num, str(proto_num))}:{port}"
    if set_type == "hash:ip,port":
        return text
    ip2 = _address(data, a[DATA_IP2])
    if set_type == "hash:ip,port,ip":
        return f"{text},{ip2}"
    cidr = data[a[DATA_CIDR2][0]] if DATA_CIDR2 in a else (128 if ":" in ip2 else 32)
    return f"{text},{ip2}/{cidr}"


def parse_list(
    msg: codec.Message, known_types: Mapping[str, str], ours: Container[str]
) -> tuple[str, str, list[str]] | None:
    """(set name, type, members) from one list reply of a set named in ``ours``; None for any
    other set, whose members (of any type) are never decoded. Members of a shape not in
    ``SHAPES`` (a set of ours someone made of another type) are skipped.

    A large set spans several replies and only the first carries the type (the kernel's
    ip_set_dump_do puts the header in the first message of a set only): the type of a set
    seen before, or known by its name, comes from ``known_types``.
    """
    start = msg.start + _NFGENMSG.size
    top = codec.attrs_of(msg.data, start, msg.end)
    if ATTR_SETNAME not in top:
        return None
    name = codec.get_str(msg.data, top[ATTR_SETNAME])
    if name not in ours:
        return None
    if ATTR_TYPENAME in top:
        set_type = codec.get_str(msg.data, top[ATTR_TYPENAME])
    elif name in known_types:
        set_type = known_types[name]
    else:
        return None
    members = []
    if ATTR_ADT in top:
        adt = top[ATTR_ADT]
        for kind, span in codec.iter_attrs(msg.data, adt[0], adt[1]):
            text = entry_text(set_type, msg.data, span) if kind == ATTR_DATA else None
            if text is not None:
                members.append(text)
    return name, set_type, members
