"""A small HTTP server for probes and scrapes that idle or slow clients cannot exhaust.

A ``Loop`` is one thread and one selector serving any number of ``HTTPServer``s (listening
sockets) and all their connections, without blocking: the health-check node ports of every
externalTrafficPolicy Local Service share one; the health, metrics and status servers have one
each. A connection must deliver its request within ``request_timeout`` seconds of being
accepted, have its answer ready within ``request_timeout`` seconds of the request and take it
within ``write_timeout`` seconds; otherwise it is closed. At ``max_connections`` open
connections of a server (those whose answer a worker is preparing included) its oldest one is
closed to admit the next, so idle or slow clients (slowloris) can neither block a real probe
nor use up threads or file descriptors, nor queue work: the route of a connection closed before
a worker took it is not run. Handlers run on the loop's thread, or on its fixed pool of
``workers`` threads when they take time (/metrics, /status). One request per connection
(``Connection: close``); GET and HEAD only.
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


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    server: HTTPServer
    deadline: float
    inbox: bytearray = field(default_factory=bytearray)
    outbox: memoryview | None = None  # the response, from the next byte to send
    busy: bool = False  # a worker is answering it (then it is not in the selector)
    closed: bool = False


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


class Loop:
    """One thread and one selector for ``HTTPServer``s and their connections, until ``close``.
    Only the loop's thread touches its selector, servers and connections: ``add`` and
    ``remove`` run there (``call``); workers only run handlers."""

    def __init__(self, name: str, workers: int = 0) -> None:
        self.name = name
        self.sel = selectors.DefaultSelector()
        self.servers: set[HTTPServer] = set()
        self.conns: dict[_Conn, None] = {}  # every server's, oldest first
        self._paused: set[HTTPServer] = set()  # accepting paused: out of file descriptors
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[tuple[_Conn, bytes]] = queue.SimpleQueue()
        self._jobs: queue.SimpleQueue[tuple[_Conn, str, str] | None] = queue.SimpleQueue()
        self._closing = threading.Event()
        self.workers = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(workers)
        ]
        for w in self.workers:
            w.start()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -- life cycle --------------------------------------------------------------------------

    def add(self, server: HTTPServer) -> None:
        def add() -> None:
            self.sel.register(server.listener, selectors.EVENT_READ, server)
            self.servers.add(server)

        self.call(add)

    def remove(self, server: HTTPServer) -> None:
        """Close ``server``'s listener and connections; the port is free when this returns."""
        self.call(lambda: self._remove(server))

    def close(self) -> None:
        """Stop serving; every port is free when this returns."""
        self._closing.set()
        self._wake()
        self._thread.join(timeout=5)
        for _ in self.workers:
            self._jobs.put(None)

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the loop's thread (here once it has ended) and wait for it."""
        if threading.current_thread() is self._thread or not self._thread.is_alive():
            fn()
            return
        done = threading.Event()
        raised: list[BaseException] = []

        def run() -> None:
            try:
                fn()
            except BaseException as exc:
                raised.append(exc)
            finally:
                done.set()

        self._calls.put(run)
        self._wake()
        while not done.wait(1.0):
            if not self._thread.is_alive():  # ended meanwhile: its calls are run here
                self._run_calls()
        if raised:
            raise raised[0]

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # already woken (buffer full), or closed
            self._wake_w.send(b"\0")

    def _run(self) -> None:
        """Until closed; a failure is logged and the loop goes on (after a pause that grows
        while failures repeat): it serves every server it holds."""
        failures = 0
        try:
            while not self._closing.is_set():
                try:
                    self._step()
                    failures = 0
                except Exception:
                    failures += 1
                    log.exception("%s: HTTP server loop failed (%d in a row)", self.name, failures)
                    self._closing.wait(min(5.0, 0.01 * 2**failures))
        finally:
            for server in list(self.servers):
                self._remove(server)
            self._run_calls()
            self.sel.close()
            self._wake_r.close()
            self._wake_w.close()

    def _run_calls(self) -> None:
        while not self._calls.empty():
            self._calls.get()()

    def _remove(self, server: HTTPServer) -> None:
        for conn in list(server.conns):
            self._drop(conn)
        if server in self.servers and server not in self._paused:
            self.sel.unregister(server.listener)
        self.servers.discard(server)
        self._paused.discard(server)
        server.listener.close()

    def _step(self) -> None:
        now = time.monotonic()
        deadlines = [c.deadline for c in self.conns]
        deadlines += [s.paused_until for s in self._paused]
        timeout = max(0.0, min([*deadlines, now + 1.0]) - now)
        for key, mask in self.sel.select(timeout):
            try:
                self._event(key.data, mask)
            except Exception:  # that connection's or listener's: the others go on
                log.exception("%s: HTTP server failed", self.name)
                if isinstance(key.data, _Conn):
                    self._drop(key.data)
                elif isinstance(key.data, HTTPServer):
                    self._pause(key.data)  # not accepting for a moment: no busy loop of errors
        while not self._done.empty():
            conn, data = self._done.get()
            self._respond(conn, data)
        self._run_calls()
        self._expire(time.monotonic())

    def _event(self, data: object, mask: int) -> None:
        if data is None:
            self._drain_wake()
        elif isinstance(data, HTTPServer):
            self._accept(data)
        elif isinstance(data, _Conn) and not data.closed:
            if mask & selectors.EVENT_READ:
                self._read(data)
            elif mask & selectors.EVENT_WRITE:
                self._write(data)

    # -- connections -------------------------------------------------------------------------

    def _accept(self, server: HTTPServer) -> None:
        while True:
            try:
                sock, _ = server.listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if self.conns:
                        self._drop(next(iter(self.conns)))
                    else:
                        self._pause(server)
                    return
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                    continue
                raise
            sock.setblocking(False)
            conn = _Conn(sock, server, deadline=time.monotonic() + server.request_timeout)
            server.conns[conn] = None
            self.conns[conn] = None
            self.sel.register(sock, selectors.EVENT_READ, conn)
            if len(server.conns) > server.max_connections:
                self._drop(next(iter(server.conns)))

    def _pause(self, server: HTTPServer) -> None:
        """Out of file descriptors with nothing to close: stop accepting for a moment."""
        self.sel.unregister(server.listener)
        server.paused_until = time.monotonic() + 0.5
        self._paused.add(server)

    def _drop(self, conn: _Conn) -> None:
        if conn.closed:
            return
        conn.closed = True
        conn.server.conns.pop(conn, None)
        self.conns.pop(conn, None)
        if not conn.busy:
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
        late = [c for c in self.conns if c.deadline <= now]
        for conn in late:
            self._drop(conn)
        for server in [s for s in self._paused if now >= s.paused_until]:
            self._paused.discard(server)
            self.sel.register(server.listener, selectors.EVENT_READ, server)

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
        elif self.workers:
            # Its answer, too, has a deadline, and it stays under the server's cap.
            conn.busy = True
            conn.deadline = time.monotonic() + conn.server.request_timeout
            self.sel.unregister(conn.sock)
            self._jobs.put((conn, *parsed))
        else:
            self._respond(conn, conn.server.answer(*parsed))

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            conn, method, path = job
            if conn.closed:  # its client is gone (the cap, a deadline): not worth the work
                continue
            self._done.put((conn, conn.server.answer(method, path)))
            self._wake()

    def _respond(self, conn: _Conn, data: bytes) -> None:
        """Send ``data``, then close; the rest of the request is not read."""
        if conn.closed:
            return
        if conn.busy:
            conn.busy = False
            self.sel.register(conn.sock, selectors.EVENT_WRITE, conn)
        else:
            self.sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
        conn.outbox = memoryview(data)
        conn.deadline = time.monotonic() + conn.server.write_timeout
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


class HTTPServer:
    """Serves ``handler`` on (host, port) until ``close``: from ``loop``, or from a loop of its
    own with ``workers`` worker threads."""

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
        loop: Loop | None = None,
    ) -> None:
        self.handler = handler
        self.name = name
        self.request_timeout = request_timeout
        self.write_timeout = write_timeout
        self.max_connections = max_connections
        self.conns: dict[_Conn, None] = {}  # oldest first
        self.paused_until = 0.0
        self.listener = _bind(host, port)
        self.server_address = self.listener.getsockname()
        self._own_loop = loop is None
        self.loop = Loop(name, workers) if loop is None else loop
        try:
            self.loop.add(self)
        except BaseException:
            self.listener.close()
            if self._own_loop:
                self.loop.close()
            raise

    def close(self) -> None:
        """Stop serving; the port is free when this returns."""
        self.loop.remove(self)
        if self._own_loop:
            self.loop.close()

    def answer(self, method: str, path: str) -> bytes:
        try:
            resp = self.handler(path)
        except Exception:
            log.exception("%s: %s %s", self.name, method, path)
            resp = text(500, "internal server error")
        return render(resp, method == "HEAD")
