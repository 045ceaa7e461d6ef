"""The daemon's HTTP servers listen as upstream's do. kube-proxy listens with Go's
``net.Listen("tcp", addr)``, which on Linux takes a wildcard address (0.0.0.0, ::, or none) as
both families (one IPv6 socket with IPV6_V6ONLY off): its default ``0.0.0.0:10256`` answers the
kubelet's probe at an IPv6-only node's IPv6 address. A specific address is that address alone.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Callable, Iterator

import pytest

from ipvsproxy.servers.healthz import HealthState, serve_routes
from ipvsproxy.servers.healthz import serve as serve_health
from ipvsproxy.servers.httpserver import HTTPServer
from ipvsproxy.servers.service_health import HealthCheckServers, Target


def free_port() -> int:
    """A TCP port free in both families now."""
    with socket.socket(socket.AF_INET6) as s:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        s.bind(("::", 0))
        return int(s.getsockname()[1])


def status(host: str, port: int, path: str = "/") -> int | None:
    """The answer's status code; None when the connection is refused."""
    conn = http.client.HTTPConnection(host, port, timeout=3)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except ConnectionRefusedError:
        return None
    finally:
        conn.close()


@pytest.fixture
def serving() -> Iterator[Callable[[HTTPServer], None]]:
    """Keeps the servers a test starts, to close them after it."""
    servers: list[HTTPServer] = []
    yield servers.append
    for server in servers:
        server.close()


def test_the_health_server_on_0_0_0_0_answers_over_ipv6_too(
    serving: Callable[[HTTPServer], None],
) -> None:
    port = free_port()
    serving(serve_health(HealthState(timeout=60), f"0.0.0.0:{port}"))
    for host in ("127.0.0.1", "::1"):
        assert status(host, port, "/healthz") == 200, host
        assert status(host, port, "/livez") == 200, host


@pytest.mark.parametrize("address", ["0.0.0.0:{}", "[::]:{}", ":{}"])
def test_a_wildcard_address_takes_both_families(
    serving: Callable[[HTTPServer], None], address: str
) -> None:
    port = free_port()
    serving(serve_routes(address.format(port), {"/m": lambda: (200, "text/plain", b"")}, "m"))
    assert status("127.0.0.1", port, "/m") == 200
    assert status("::1", port, "/m") == 200


def test_a_specific_address_is_that_address_alone(
    serving: Callable[[HTTPServer], None],
) -> None:
    port = free_port()
    serving(serve_health(HealthState(timeout=60), f"127.0.0.1:{port}"))
    assert status("127.0.0.1", port, "/healthz") == 200
    assert status("::1", port, "/healthz") is None
    port = free_port()
    serving(serve_health(HealthState(timeout=60), f"[::1]:{port}"))
    assert status("::1", port, "/healthz") == 200
    assert status("127.0.0.1", port, "/healthz") is None


def test_health_check_node_ports_on_every_address_answer_over_ipv6() -> None:
    """No nodePortAddresses: every address of the node, IPv6 ones too (upstream's IPv6
    proxier listens on [::]), where a load balancer probes an IPv6 node."""
    hcs = HealthCheckServers()
    port = free_port()
    try:
        hcs.sync({port: Target("default/web", 1)}, None)
        assert status("127.0.0.1", port) == 200
        assert status("::1", port) == 200
    finally:
        hcs.close()
