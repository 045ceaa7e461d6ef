"""A netlink socket that sends many requests per system call and learns every request's outcome.

Requests go hundreds per ``send()`` (up to ``BATCH_BYTES``), never one per round trip: a system
call per request would make the calls, not the kernel's work, a sync's cost (docs/performance.md
compares both with ``ipvsadm -R``). The kernel answers every failed request with an error naming
its sequence number, asked or not, and handles the requests of one send in order; so only the
last request of a batch asks for an ack, and that ack means every earlier request was handled: a
request without an error succeeded. An ack for every request would cost one ``recv()`` system
call per request (each ack is its own socket buffer), as many system calls as requests. The
kernel rejecting one message of a batch is still reported against that message, and the rest of
the batch still runs.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

from ipvsproxy.kernel.netlink import codec

NETLINK_ROUTE = 0
NETLINK_NETFILTER = 12
NETLINK_GENERIC = 16
SOL_NETLINK = 270
NETLINK_EXT_ACK = 11

GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2

# Bytes of requests per send(), below the kernel's default socket send buffer (208 KiB).
BATCH_BYTES = 128 * 1024
RCVBUF = 64 * 1024 * 1024
# One received socket buffer: dump parts are at most 32 KiB, errors echo one request.
RECV_BYTES = 1024 * 1024
# The byte of nlmsghdr.nlmsg_flags (host order, at offset 6) that holds NLM_F_ACK.
_ACK_BYTE = 6 if sys.byteorder == "little" else 7


class NetlinkError(OSError):
    """The kernel rejected a request."""


class Outcome(NamedTuple):
    """What the kernel said of one request: errno 0 for success. (A named tuple: a cold sync
    gets one per real server.)"""

    seq: int
    errno: int

    @property
    def ok(self) -> bool:
        return self.errno == 0

    @property
    def message(self) -> str:
        return os.strerror(self.errno) if self.errno else "ok"


class Channel(Protocol):
    """What a backend asks of its netlink socket: ``NetlinkSocket`` on a kernel, or a stand-in
    that answers each request as a fake kernel would (``kernel.fakes.codec``)."""

    sends: int  # system calls that carried requests
    receives: int  # system calls that read replies

    def next_seq(self) -> int: ...

    def execute(self, requests: Sequence[tuple[int, bytes]]) -> list[Outcome]: ...

    def dump(self, request: bytes, seq: int) -> Iterator[codec.Message]: ...

    def request(self, request: bytes, seq: int) -> list[codec.Message]: ...

    def close(self) -> None: ...


class NetlinkSocket:
    """A netlink socket of ``protocol``, bound to a port the kernel picks; one user at a time
    (nothing here locks).

    Owns the socket, its sequence numbers (``next_seq``: never 0, wrapping at 2**32) and one
    receive buffer that every ``recv()`` reuses. ``execute`` returns one Outcome per request,
    in the requests' order, and does not raise for a request the kernel refuses (its errno is
    in the Outcome); ``dump`` and ``request`` raise NetlinkError when the kernel refuses
    theirs. Replies to other sequence numbers are skipped. ``sends`` and ``receives`` count
    the system calls made."""

    def __init__(self, protocol: int) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, protocol)
        try:
            # Acks for a large batch overflow a default receive buffer (ENOBUFS).
            self.sock.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)  # SO_RCVBUFFORCE (root)
        except PermissionError:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        self.sock.bind((0, 0))
        self._seq = int.from_bytes(os.urandom(2), "little") << 8
        self.sends = 0  # system calls that carried requests, for the metrics and tests
        self.receives = 0  # system calls that read replies, for the tests
        self._buffer = bytearray(RECV_BYTES)  # reused: a fresh one per recv() is an mmap

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> NetlinkSocket:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF or 1
        return self._seq

    def _recv(self) -> bytes:
        n = self.sock.recv_into(self._buffer)
        self.receives += 1
        return bytes(memoryview(self._buffer)[:n])

    def execute(self, requests: Sequence[tuple[int, bytes]]) -> list[Outcome]:
        """Send (seq, message) requests that each ask for an ack; one Outcome per request."""
        outcomes: list[Outcome] = []
        batch: list[tuple[int, bytes]] = []
        size = 0
        for seq, msg in requests:
            if batch and size + len(msg) > BATCH_BYTES:
                outcomes += self._send_batch(batch)
                batch, size = [], 0
            batch.append((seq, msg))
            size += len(msg)
        if batch:
            outcomes += self._send_batch(batch)
        return outcomes

    def _send_batch(self, batch: list[tuple[int, bytes]]) -> list[Outcome]:
        """Send the batch with only its last request asking for an ack (see the module's
        docstring); requests come with NLM_F_ACK set and are whole netlink messages."""
        data = bytearray(b"".join(request for _, request in batch))
        off = 0
        for _, request in batch[:-1]:
            data[off + _ACK_BYTE] &= ~codec.NLM_F_ACK
            off += len(request)
        self.sock.sendall(data)
        self.sends += 1
        seqs = {seq for seq, _ in batch}
        last = batch[-1][0]
        failed: dict[int, int] = {}
        done = False
        while not done:
            for msg in codec.messages(self._recv()):
                if msg.type != codec.NLMSG_ERROR or msg.seq not in seqs:
                    continue
                if msg.error:
                    failed[msg.seq] = -msg.error
                done = done or msg.seq == last
        return [Outcome(seq, failed.get(seq, 0)) for seq, _ in batch]

    def dump(self, request: bytes, seq: int) -> Iterator[codec.Message]:
        """Send one dump request and yield its messages until NLMSG_DONE."""
        self.sock.sendall(request)
        while True:
            for msg in codec.messages(self._recv()):
                if msg.seq != seq:
                    continue
                if msg.type == codec.NLMSG_DONE:
                    return
                if msg.type == codec.NLMSG_ERROR:
                    if msg.error:
                        raise NetlinkError(-msg.error, os.strerror(-msg.error))
                    return
                yield msg

    def request(self, request: bytes, seq: int) -> list[codec.Message]:
        """Send one request expecting a single reply (no ack asked)."""
        self.sock.sendall(request)
        replies: list[codec.Message] = []
        while not replies:
            for msg in codec.messages(self._recv()):
                if msg.seq != seq:
                    continue
                if msg.type == codec.NLMSG_ERROR:
                    if msg.error:
                        raise NetlinkError(-msg.error, os.strerror(-msg.error))
                    continue
                replies.append(msg)
        return replies


def resolve_family(sock: Channel, name: str) -> int:
    """The generic netlink family id of ``name`` (e.g. "IPVS")."""
    seq = sock.next_seq()
    body = codec.attr_str(CTRL_ATTR_FAMILY_NAME, name)
    req = codec.genl_message(GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1, seq, codec.NLM_F_REQUEST, body)
    try:
        (reply,) = sock.request(req, seq)
    except NetlinkError as exc:
        if exc.errno == errno.ENOENT:
            raise NetlinkError(
                errno.ENOENT, f"generic netlink family {name} not found (module not loaded?)"
            ) from None
        raise
    return codec.get_u16(reply.data, reply.attrs()[CTRL_ATTR_FAMILY_ID])


def failures(outcomes: Iterable[Outcome]) -> list[Outcome]:
    return [o for o in outcomes if not o.ok]
