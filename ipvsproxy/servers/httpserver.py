"""A small HTTP server for probes and scrapes that idle or slow clients cannot exhaust.

One thread per listening socket reads requests and writes responses for every connection,
without blocking, through a selector. A connection must deliver its request within
``request_timeout`` seconds of being accepted and take its response within ``write_timeout``
seconds of it being ready; otherwise it is closed. At ``max_connections`` open connections the
oldest one is closed to admit the next, so idle connections (slowloris) can neither block a real
probe nor use up threads or file descriptors. Handlers run on that thread, or on a fixed pool of
``workers`` threads when they may wait (``/status`` waits for a running sync). One request per
connection (``Connection: close``); GET and HEAD only.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus

log = logging.getLogger("ipvsproxy.http")

MAX_REQUEST = 16384  # bytes of request line and headers
REQUEST_TIMEOUT = 10.0
WRITE_TIMEOUT = 10.0
MAX_CONNECTIONS = 256


@dataclass(frozen=True)
class Response:
    code: int
    content_type: str
    body: bytes
    headers: Sequence[tuple[str, str]] = ()


# A handler answers the request's path (without the query string).
Handler = Callable[[str], Response]


def text(code: int, message: str) -> Response:
    return Response(code, "text/plain; charset=utf-8", message.encode() + b"\n")


def render(resp: Response, head_only: bool) -> bytes:
    try:
        phrase = HTTPStatus(resp.code).phrase
    except ValueError:
        phrase = ""
    lines = [
        f"HTTP/1.1 {resp.code} {phrase}",
        f"Content-Type: {resp.content_type}",
        "X-Content-Type-Options: nosniff",
        *(f"{name}: {value}" for name, value in resp.headers),
        f"Content-Length: {len(resp.body)}",
        "Connection: close",
    ]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + resp.body


def parse_request(raw: bytes) -> tuple[str, str] | Response:
    """(method, path) from a request's head, or the error response to send."""
    line = raw.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return text(400, "bad request")
    method, target = parts[0], parts[1]
    if method not in ("GET", "HEAD"):
        return text(501, f"unsupported method {method}")
    return method, target.split("?", 1)[0]


@dataclass
class _Conn:
    sock: socket.socket
    accepted: float
    inbox: bytearray = field(default_factory=bytearray)
    outbox: memoryview | None = None  # the response, from the next byte to send
    deadline: float = 0.0
    busy: bool = False  # a worker is answering it


WILDCARDS = ("0.0.0.0", "::", "")


def _socket(host: str) -> tuple[socket.socket, str]:
    """A TCP socket for ``host`` and the address to bind. A wildcard takes both families, as
    upstream's Go listeners do (net.Listen "tcp" on 0.0.0.0 or ::): one IPv6 socket with
    IPV6_V6ONLY off, or an IPv4 one where the kernel has no IPv6."""
    if host in WILDCARDS:
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        except OSError:  # a kernel without IPv6
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM), "0.0.0.0"
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        return sock, "::"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.socket(family, socket.SOCK_STREAM), host


def _bind(host: str, port: int) -> socket.socket:
    sock, host = _socket(host)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class HTTPServer:
    """Serves ``handler`` on (host, port) from a daemon thread until ``close``."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: Handler,
        name: str,
        *,
        workers: int = 0,
        request_timeout: float = REQUEST_TIMEOUT,
        write_timeout: float = WRITE_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.handler = handler
        self.name = name
        self.request_timeout = request_timeout
        self.write_timeout = write_timeout
        self.max_connections = max_connections
        self.listener = _bind(host, port)
        self.server_address = self.listener.getsockname()
        self.conns: dict[int, _Conn] = {}  # by file descriptor, oldest first
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ)
        self._done: queue.SimpleQueue[tuple[_Conn, bytes]] = queue.SimpleQueue()
        self._jobs: queue.SimpleQueue[tuple[_Conn, str, str] | None] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._paused_until = 0.0  # accepting paused: out of file descriptors
        self._workers = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for w in self._workers:
            w.start()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- life cycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop serving; the port is free when this returns."""
        self._closing.set()
        self._wake()
        self._thread.join(timeout=5)
        for _ in self._workers:
            self._jobs.put(None)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # already woken (buffer full), or closed
            self._wake_w.send(b"\0")

    def _loop(self) -> None:
        try:
            while not self._closing.is_set():
                self._step()
        except Exception:  # the server must not die silently
            log.exception("%s: HTTP server failed", self.name)
        finally:
            for conn in list(self.conns.values()):
                self._drop(conn)
            self.sel.close()
            self.listener.close()
            self._wake_r.close()
            self._wake_w.close()

    def _step(self) -> None:
        now = time.monotonic()
        deadlines = [c.deadline for c in self.conns.values() if not c.busy]
        if self._paused_until:
            deadlines.append(self._paused_until)
        timeout = max(0.0, min([*deadlines, now + 1.0]) - now)
        for key, mask in self.sel.select(timeout):
            if key.fileobj is self.listener:
                self._accept()
            elif key.fileobj is self._wake_r:
                self._drain_wake()
            else:
                conn = self.conns.get(key.fd)
                if conn is not None and mask & selectors.EVENT_READ:
                    self._read(conn)
                elif conn is not None and mask & selectors.EVENT_WRITE:
                    self._write(conn)
        while not self._done.empty():
            conn, data = self._done.get()
            self._respond(conn, data)
        self._expire(time.monotonic())

    # -- connections -------------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if not self._drop_oldest():
                        self._pause()
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                raise
            sock.setblocking(False)
            now = time.monotonic()
            conn = _Conn(sock, now, deadline=now + self.request_timeout)
            self.conns[sock.fileno()] = conn
            self.sel.register(sock, selectors.EVENT_READ)
            if len(self.conns) > self.max_connections:
                self._drop_oldest()

    def _pause(self) -> None:
        """Out of file descriptors with nothing to close: stop accepting for a moment."""
        self.sel.unregister(self.listener)
        self._paused_until = time.monotonic() + 0.5

    def _drop_oldest(self) -> bool:
        for conn in self.conns.values():
            if not conn.busy:
                self._drop(conn)
                return True
        return False

    def _drop(self, conn: _Conn) -> None:
        if self.conns.pop(conn.sock.fileno(), None) is not None and not conn.busy:
            self.sel.unregister(conn.sock)
        conn.sock.close()

    def _finish(self, conn: _Conn) -> None:
        """Close after the response: what the client sent beyond the request head is read
        first, as closing with unread data would reset the connection under the response."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
            while conn.sock.recv(65536):
                pass
        except OSError:
            pass
        self._drop(conn)

    def _expire(self, now: float) -> None:
        late = [c for c in self.conns.values() if not c.busy and c.deadline <= now]
        for conn in late:
            self._drop(conn)
        if self._paused_until and now >= self._paused_until:
            self._paused_until = 0.0
            self.sel.register(self.listener, selectors.EVENT_READ)

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        conn.inbox += data
        end = conn.inbox.find(b"\r\n\r\n")
        if end < 0:
            if len(conn.inbox) > MAX_REQUEST:
                self._respond(conn, render(text(431, "request header too large"), False))
            return
        parsed = parse_request(bytes(conn.inbox[:end]))
        if isinstance(parsed, Response):
            self._respond(conn, render(parsed, False))
        elif self._workers:
            conn.busy = True
            self.sel.unregister(conn.sock)
            self._jobs.put((conn, *parsed))
        else:
            self._respond(conn, self._answer(*parsed))

    def _answer(self, method: str, path: str) -> bytes:
        try:
            resp = self.handler(path)
        except Exception:
            log.exception("%s: %s %s", self.name, method, path)
            resp = text(500, "internal server error")
        return render(resp, method == "HEAD")

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            conn, method, path = job
            self._done.put((conn, self._answer(method, path)))
            self._wake()

    def _respond(self, conn: _Conn, data: bytes) -> None:
        """Send ``data``, then close; the rest of the request is not read."""
        if conn.busy:
            conn.busy = False
            if self._closing.is_set():
                conn.sock.close()
                return
            self.sel.register(conn.sock, selectors.EVENT_WRITE)
        else:
            self.sel.modify(conn.sock, selectors.EVENT_WRITE)
        conn.outbox = memoryview(data)
        conn.deadline = time.monotonic() + self.write_timeout
        self._write(conn)

    def _write(self, conn: _Conn) -> None:
        if conn.outbox is None:
            return
        try:
            sent = conn.sock.send(conn.outbox)
        except BlockingIOError:
            return
        except OSError:
            self._drop(conn)
            return
        conn.outbox = conn.outbox[sent:]
        if not conn.outbox:
            self._finish(conn)
