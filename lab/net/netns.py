"""Network namespaces from inside one Python process.

A socket belongs to the network namespace it was created in, whatever the creating thread does
next. So the lab makes sockets in any namespace by switching the calling thread into it for the
``socket()`` call only, instead of forking ``ip netns exec`` (about 25 ms a process in the
guest) for every request a test sends.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

RequestFn = Callable[..., dict[str, Any]]

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(netns: str | None) -> Iterator[None]:
    """Run the body with this thread in ``netns`` (None: stay where we are)."""
    if netns is None:
        yield
        return
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(NETNS_DIR / netns, os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(own)


def make_socket(
    netns: str | None, kind: int, family: int = socket.AF_INET, proto: int = 0
) -> socket.socket:
    with entered(netns):
        return socket.socket(family, kind, proto)


def write_sysctl(netns: str | None, name: str, value: str) -> None:
    """Set a per-namespace sysctl: /proc/sys/net is resolved in the opener's namespace."""
    path = Path("/proc/sys") / name.replace(".", "/")
    with entered(netns):
        path.write_text(value)


def read_sysctl(netns: str | None, name: str) -> str:
    path = Path("/proc/sys") / name.replace(".", "/")
    with entered(netns):
        return path.read_text().strip()


def family_of(host: str) -> socket.AddressFamily:
    """AF_INET6 for an IPv6 literal (``fd00::1`` or ``[fd00::1]``), else AF_INET."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _literal(host: str) -> str:
    """An address without the brackets of ``[fd00::1]``."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def split_hostport(text: str) -> tuple[str, int]:
    """The (address, port) of an echo answer's ``client`` or ``server``: ``10.244.1.11:4242``
    or ``[fd00:10:244:1::11]:4242``."""
    host, _, port = text.rpartition(":")
    return _literal(host), int(port)


def tcp_request(
    netns: str | None,
    host: str,
    port: int,
    payload: bytes = b"hello\n",
    timeout: float = 5.0,
    proto: int = 0,
) -> dict[str, Any]:
    """Connect from ``netns`` and return the echo server's JSON answer (one-shot session).
    ``host`` is an IPv4 or IPv6 address."""
    with TCPSession(netns, host, port, timeout, proto) as session:
        return session.ask(payload)


class TCPSession:
    """A long-lived connection to an echo server: one answer per ``ask``."""

    def __init__(
        self, netns: str | None, host: str, port: int, timeout: float = 5.0, proto: int = 0
    ) -> None:
        host = _literal(host)
        self.sock = make_socket(netns, socket.SOCK_STREAM, family_of(host), proto)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.local = self.sock.getsockname()

    def ask(self, payload: bytes = b"ping\n") -> dict[str, Any]:
        self.sock.sendall(payload)
        data = b""
        while not data.endswith(b"\n"):
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionResetError("echo server closed the connection")
            data += chunk
        answer: dict[str, Any] = json.loads(data)
        return answer

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> TCPSession:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def sctp_request(
    netns: str | None, host: str, port: int, payload: bytes = b"hello\n", timeout: float = 5.0
) -> dict[str, Any]:
    return tcp_request(netns, host, port, payload, timeout, proto=socket.IPPROTO_SCTP)


def udp_request(
    netns: str | None,
    host: str,
    port: int,
    payload: bytes = b"hello\n",
    timeout: float = 5.0,
    source_port: int = 0,
) -> dict[str, Any]:
    host = _literal(host)
    family = family_of(host)
    with make_socket(netns, socket.SOCK_DGRAM, family) as sock:
        sock.settimeout(timeout)
        if source_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", source_port))
        sock.connect((host, port))
        sock.send(payload)
        data = sock.recv(65536)
    answer: dict[str, Any] = json.loads(data)
    return answer
