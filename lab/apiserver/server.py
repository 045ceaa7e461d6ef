"""The APIServer object: one store, one HTTP listener in a background thread, a clean stop.

Stopping ends every watch stream (as a real apiserver closes them on shutdown, so clients see
their stream end and re-watch) and closes idle keep-alive connections, so no handler thread
outlives the server.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

from lab.apiserver import cluster, kubeconfig
from lab.apiserver.handler import Handler
from lab.apiserver.ops import Operations
from lab.apiserver.resources import core
from lab.apiserver.store import Store

log = logging.getLogger("lab.apiserver")


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # The default 5 refuses bursts of concurrent clients (an informer per kind, kubectl...).
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], app: APIServer, family: int) -> None:
        self.address_family = family
        self.app = app
        self._connections: set[socket.socket] = set()
        self._conn_lock = threading.Lock()
        super().__init__(address, Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._conn_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._conn_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def drop_connections(self) -> None:
        with self._conn_lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


def _family(host: str) -> int:
    try:
        return socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return socket.AF_INET


class APIServer:
    """A Kubernetes API server for tests: ``start()``, use ``url``, ``stop()``."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, bookmark_interval: float = 60.0
    ) -> None:
        self.host = host
        self._requested_port = port
        self.bookmark_interval = bookmark_interval
        self.store = Store()
        self.ops = Operations(self.store)
        self.stopping = False
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._bootstrap()

    def _bootstrap(self) -> None:
        for name in cluster.SYSTEM_NAMESPACES:
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            self.ops.create(core("namespaces"), None, body)

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("APIServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> APIServer:
        if self._httpd is not None:
            return self
        # A restart after stop() keeps every object and the resourceVersion counter.
        self.stopping = False
        self.store.reopen()
        self._httpd = _HTTPServer((self.host, self._requested_port), self, _family(self.host))
        self._requested_port = self.port  # a restart comes back on the same address
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"lab-apiserver-{self.port}",
            daemon=True,
        )
        self._thread.start()
        log.info("lab apiserver listening on %s", self.url)
        return self

    def write_kubeconfig(self, path: str | Path, token: str = kubeconfig.DEFAULT_TOKEN) -> Path:
        return kubeconfig.write(path, self.url, token)

    def compact(self) -> int:
        """Forget history up to now: older resourceVersions get 410 from watch and continue."""
        return self.store.compact()

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self.stopping = True
        self.store.close()
        deadline = time.monotonic() + 2.0
        while self.store.watching() and time.monotonic() < deadline:
            time.sleep(0.01)  # let each stream write its final chunk: a clean end, not a reset
        httpd.shutdown()
        httpd.drop_connections()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> APIServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
