"""Netlink framing with struct, for the hot paths.

A cold sync encodes one message per real server, and a full sync decodes one per real server
it reads back, so a message must cost microseconds, far less than pyroute2's codec spends on it
(the figures are in docs/performance.md). These helpers build and walk the same bytes as
pyroute2 (tests/unit/test_ipvs_codec.py compares them). They are pure: no sockets here.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_MULTI = 0x2
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF

_NLMSGHDR = struct.Struct("=IHHII")
_GENLHDR = struct.Struct("=BBH")
_NLAHDR = struct.Struct("=HH")
_U16 = struct.Struct("=H")
_BE16 = struct.Struct("!H")
_U32 = struct.Struct("=I")
_I32 = struct.Struct("=i")
_U64 = struct.Struct("=Q")
HEADER_LEN = _NLMSGHDR.size + _GENLHDR.size


def _pad(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return _NLAHDR.pack(length, kind) + payload + b"\0" * (_pad(length) - length)


def nested(kind: int, payload: bytes) -> bytes:
    return _NLAHDR.pack(4 + len(payload), kind | NLA_F_NESTED) + payload


def attr_u16(kind: int, value: int) -> bytes:
    return attr(kind, _U16.pack(value))


def attr_be16(kind: int, value: int) -> bytes:
    return attr(kind, _BE16.pack(value))


def attr_u32(kind: int, value: int) -> bytes:
    return attr(kind, _U32.pack(value))


def attr_str(kind: int, value: str) -> bytes:
    return attr(kind, value.encode() + b"\0")


_GENL_HEAD = struct.Struct("=IHHIIBBH")  # _NLMSGHDR + _GENLHDR in one


def genl_message(family: int, cmd: int, version: int, seq: int, flags: int, body: bytes) -> bytes:
    length = HEADER_LEN + len(body)
    return _GENL_HEAD.pack(length, family, flags, seq, 0, cmd, version, 0) + body


@dataclass(frozen=True, slots=True)
class Message:
    """One netlink message as received: header fields and where its payload lies in ``data``."""

    type: int
    flags: int
    seq: int
    data: bytes
    start: int  # first byte after the netlink header
    end: int

    @property
    def error(self) -> int:
        """For NLMSG_ERROR: 0 for an ack, else a negative errno."""
        value: int = _I32.unpack_from(self.data, self.start)[0]
        return value

    @property
    def genl_cmd(self) -> int:
        return self.data[self.start]

    def attrs(self) -> dict[int, tuple[int, int]]:
        """Top-level attributes of a generic netlink message: kind -> (start, end)."""
        return attrs_of(self.data, self.start + _GENLHDR.size, self.end)


def messages(data: bytes) -> Iterator[Message]:
    off, total = 0, len(data)
    while off + _NLMSGHDR.size <= total:
        length, kind, flags, seq, _pid = _NLMSGHDR.unpack_from(data, off)
        if length < _NLMSGHDR.size or off + length > total:
            raise ValueError(f"truncated netlink message at offset {off}")
        yield Message(kind, flags, seq, data, off + _NLMSGHDR.size, off + length)
        off += _pad(length)


def iter_attrs(data: bytes, start: int, end: int) -> Iterator[tuple[int, tuple[int, int]]]:
    """Attributes in order, repeats included (lists such as ipset's ADT)."""
    off = start
    while off + 4 <= end:
        length, kind = _NLAHDR.unpack_from(data, off)
        if length < 4:
            break
        yield kind & NLA_TYPE_MASK, (off + 4, off + length)
        off += _pad(length)


def attrs_of(data: bytes, start: int, end: int) -> dict[int, tuple[int, int]]:
    """Attributes by kind: kind -> (start, end) of the payload."""
    return dict(iter_attrs(data, start, end))


def get_u16(data: bytes, span: tuple[int, int]) -> int:
    value: int = _U16.unpack_from(data, span[0])[0]
    return value


def get_be16(data: bytes, span: tuple[int, int]) -> int:
    value: int = _BE16.unpack_from(data, span[0])[0]
    return value


def get_u32(data: bytes, span: tuple[int, int]) -> int:
    value: int = _U32.unpack_from(data, span[0])[0]
    return value


def get_u64(data: bytes, span: tuple[int, int]) -> int:
    value: int = _U64.unpack_from(data, span[0])[0]
    return value


def get_str(data: bytes, span: tuple[int, int]) -> str:
    return data[span[0] : span[1]].split(b"\0", 1)[0].decode()


def get_bytes(data: bytes, span: tuple[int, int]) -> bytes:
    return data[span[0] : span[1]]
