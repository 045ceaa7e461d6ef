"""/healthz, /livez, /metrics and the health-check node ports under 1,000 idle connections
(slowloris): a real probe is still answered and the number of threads stays what it was. And
/status can be moved off the metrics address or turned off."""

from __future__ import annotations

import argparse
import http.client
import resource
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ipvsproxy import config
from ipvsproxy.daemon.wiring import serve_metrics
from ipvsproxy.servers.healthz import HealthState, json_route, serve_routes
from ipvsproxy.servers.healthz import serve as serve_health
from ipvsproxy.servers.httpserver import HTTPServer, Response
from ipvsproxy.servers.metrics import Metrics
from ipvsproxy.servers.service_health import HealthCheckServers, Target
from ipvsproxy.status import command, view

IDLE = 1000
PROBE_TIMEOUT = 5.0  # a failure bound, not a speed requirement


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def enough_file_descriptors() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * IDLE if hard == resource.RLIM_INFINITY else min(hard, 4 * IDLE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def healthz(port: int) -> Callable[[], None]:
    server = serve_health(HealthState(timeout=60, last_updated=time.time()), f"127.0.0.1:{port}")
    return server.close


def metrics(port: int) -> Callable[[], None]:
    server = Metrics().serve(f"127.0.0.1:{port}", {})
    return server.close


def health_check_port(port: int) -> Callable[[], None]:
    servers = HealthCheckServers()
    servers.sync({port: Target("default/web", 1)})
    return servers.close


SERVERS: dict[str, tuple[Callable[[int], Callable[[], None]], list[str]]] = {
    "healthz": (healthz, ["/healthz", "/livez"]),
    "metrics": (metrics, ["/metrics"]),
    "health check node port": (health_check_port, ["/"]),
}


def idle_connections(port: int, n: int) -> list[socket.socket]:
    """Half send nothing, half a request head that never ends."""
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=PROBE_TIMEOUT)
        if i % 2:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)
    return socks


@pytest.mark.parametrize("name", list(SERVERS))
def test_a_probe_is_answered_through_1000_idle_connections(name: str) -> None:
    start, paths = SERVERS[name]
    port = free_port()
    close = start(port)
    socks: list[socket.socket] = []
    try:
        assert get(port, paths[0])[0] == 200
        threads = threading.active_count()
        socks = idle_connections(port, IDLE)
        for path in paths:
            assert get(port, path)[0] == 200
        # Every connection was accepted before the probe's: no thread was started for them.
        assert threading.active_count() <= threads
    finally:
        for s in socks:
            s.close()
        close()


def test_a_connection_that_sends_no_request_is_closed() -> None:
    server = HTTPServer(
        "127.0.0.1", 0, lambda _p: Response(200, "text/plain", b"ok"), "t", request_timeout=0.3
    )
    try:
        with socket.create_connection(server.server_address[:2], timeout=PROBE_TIMEOUT) as s:
            s.sendall(b"GET / HTTP/1.1\r\n")
            assert s.recv(100) == b""  # closed by the server, not by the 5 s bound
    finally:
        server.close()


class Held:
    """A handler that waits until released (a route on a worker), counting its calls."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def __call__(self, _path: str) -> Response:
        self.calls += 1
        self.release.wait(PROBE_TIMEOUT)
        return Response(200, "text/plain", b"ok")


def closed_by_server(s: socket.socket) -> bool:
    try:
        return s.recv(100) == b""
    except ConnectionResetError:  # closed with the request unread
        return True
    except TimeoutError:
        return False


def test_connections_handed_to_workers_are_under_the_cap() -> None:
    """Requests waiting for a worker count against the cap, the oldest closed first, and
    their routes are not run once their connection is gone."""
    held = Held()
    server = HTTPServer("127.0.0.1", 0, held, "t", workers=1, max_connections=4)
    socks: list[socket.socket] = []
    try:
        for _ in range(10):
            s = socket.create_connection(server.server_address[:2], timeout=PROBE_TIMEOUT)
            s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
            socks.append(s)
        assert all(closed_by_server(s) for s in socks[:6])
        held.release.set()
        for s in socks[6:]:
            assert s.recv(100).startswith(b"HTTP/1.1 200 OK")
        # The four kept, and the one that may have been running when its connection closed.
        assert held.calls <= 5
    finally:
        held.release.set()
        for s in socks:
            s.close()
        server.close()


def test_a_connection_handed_to_a_worker_has_a_deadline() -> None:
    held = Held()
    server = HTTPServer("127.0.0.1", 0, held, "t", workers=1, request_timeout=0.3)
    try:
        with socket.create_connection(server.server_address[:2], timeout=PROBE_TIMEOUT) as s:
            s.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
            assert closed_by_server(s)  # by the server, before the route answered
    finally:
        held.release.set()
        server.close()


def test_daemon_servers_time_out_idle_connections() -> None:
    """The timeout above is what the daemon's servers use: finite, not the 1,000 idle ones'
    forever."""
    server = serve_health(HealthState(timeout=60), f"127.0.0.1:{free_port()}")
    try:
        assert 0 < server.request_timeout <= 60
        assert 0 < server.write_timeout <= 60
    finally:
        server.close()


class _Proxy:
    def status_document(self, kernel: bool = False) -> dict[str, Any]:
        return {"node": "node-1"} | ({"ipsets": {}} if kernel else {})


@pytest.mark.parametrize(
    ("flag", "on_metrics", "apart"),
    [(None, 200, False), ("", 404, False), ("apart", 404, True)],
    ids=["default: next to /metrics", "empty: off", "own address"],
)
def test_status_is_next_to_metrics_apart_or_off(
    flag: str | None, on_metrics: int, apart: bool
) -> None:
    metrics_port, status_port = free_port(), free_port()
    argv = ["--metrics-bind-address", f"127.0.0.1:{metrics_port}"]
    if flag is not None:
        argv += ["--status-bind-address", f"127.0.0.1:{status_port}" if apart else flag]
    cfg = config.build(None, argv)
    servers = serve_metrics(cfg, Metrics(), _Proxy())  # type: ignore[arg-type]
    try:
        assert get(metrics_port, "/metrics")[0] == 200
        assert get(metrics_port, "/status")[0] == on_metrics
        assert get(metrics_port, "/status/all")[0] == on_metrics
        if apart:
            assert get(status_port, "/status") == (200, b'{"node": "node-1"}')
            assert get(status_port, "/status/all") == (200, b'{"node": "node-1", "ipsets": {}}')
            assert get(status_port, "/metrics")[0] == 404
        else:
            with pytest.raises(ConnectionRefusedError):
                get(status_port, "/status")
    finally:
        for s in servers:
            s.close()


def test_status_needs_a_port() -> None:
    with pytest.raises(
        config.ConfigError, match=r"--status-bind-address: '127\.0\.0\.1' must be IP:port"
    ):
        config.build(None, ["--status-bind-address", "127.0.0.1"])


def test_ipvsproxy_status_is_pointed_at_a_status_address() -> None:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(["--status-address", "127.0.0.1:10300"])
    assert args.metrics_address == "127.0.0.1:10300"


def test_status_all_falls_back_to_status_from_a_daemon_without_it() -> None:
    """An older daemon serves no /status/all: status --all reads /status, its sets' and
    chains' drift unknown."""
    doc = view.daemon_document("node-1", {}, {}, {}, 1.0, 0, {})
    port = free_port()
    server = serve_routes(f"127.0.0.1:{port}", {"/status": json_route(lambda: (200, doc))}, "s")
    try:
        base = f"http://127.0.0.1:{port}/status"
        daemon, error = command._fetch_daemon(f"{base}/all", 2, fallback=base)
        assert error is None and daemon is not None and daemon.node == "node-1"
        assert daemon.sets is None and daemon.chains is None
        daemon, error = command._fetch_daemon(f"{base}/all", 2)
        assert daemon is None and error is not None and "404" in error
    finally:
        server.close()
