"""Health-check node ports (upstream pkg/proxy/healthcheck/service_health.go): the answer, the
addresses they listen on, and the Event when a port cannot be bound."""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from ipvsproxy.servers.service_health import HealthCheckServers, Target


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def get(address: str, port: int) -> tuple[int, dict[str, Any], dict[str, str]]:
    conn = http.client.HTTPConnection(address, port, timeout=3)
    try:
        conn.request("GET", "/")
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read()), dict(resp.getheaders())
    finally:
        conn.close()


def refused(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


class Health:
    def __init__(self) -> None:
        self.ok = True

    def __call__(self) -> bool:
        return self.ok


@pytest.fixture
def servers() -> Iterator[tuple[HealthCheckServers, Health, list[tuple[str, str, str]]]]:
    health = Health()
    reported: list[tuple[str, str, str]] = []
    hcs = HealthCheckServers(
        proxy_healthy=health,
        report=lambda *event: reported.append(event),
        node="node-1",
    )
    try:
        yield hcs, health, reported
    finally:
        hcs.close()


def test_the_answer_follows_local_endpoints_and_the_proxys_health(servers: Any) -> None:
    hcs, health, _ = servers
    port = free_port()
    hcs.sync({port: Target("default/web", 2)}, ("127.0.0.1",))
    status, body, headers = get("127.0.0.1", port)
    assert status == 200
    assert body == {
        "service": {"namespace": "default", "name": "web"},
        "localEndpoints": 2,
        "serviceProxyHealthy": True,
    }
    assert headers["X-Load-Balancing-Endpoint-Weight"] == "2"
    # An unhealthy proxy (upstream's IsHealthy: /livez's answer) is 503 whatever the count.
    health.ok = False
    status, body, _ = get("127.0.0.1", port)
    assert status == 503
    assert body["serviceProxyHealthy"] is False and body["localEndpoints"] == 2
    health.ok = True
    hcs.sync({port: Target("default/web", 0)}, ("127.0.0.1",))
    status, body, _ = get("127.0.0.1", port)
    assert status == 503 and body["serviceProxyHealthy"] is True


def test_it_listens_on_the_node_port_addresses_only(servers: Any) -> None:
    hcs, _, _ = servers
    port = free_port()
    hcs.sync({port: Target("default/web", 1)}, ("127.0.0.2", "127.0.0.3"))
    assert get("127.0.0.2", port)[0] == 200
    assert get("127.0.0.3", port)[0] == 200
    assert refused("127.0.0.1", port)
    # The addresses change (nodePortAddresses' matches follow the node's): so do the listeners.
    hcs.sync({port: Target("default/web", 1)}, ("127.0.0.1",))
    assert get("127.0.0.1", port)[0] == 200
    assert refused("127.0.0.2", port)
    # No nodePortAddresses: every address, as upstream.
    hcs.sync({port: Target("default/web", 1)}, None)
    assert get("127.0.0.4", port)[0] == 200
    # nodePortAddresses matches no node address: nowhere, as upstream.
    hcs.sync({port: Target("default/web", 1)}, ())
    assert refused("127.0.0.4", port)
    hcs.sync({port: Target("default/web", 1)}, None)
    hcs.sync({}, None)
    assert refused("127.0.0.4", port)


def test_a_port_that_cannot_be_bound_is_an_event_on_the_service(servers: Any) -> None:
    hcs, _, reported = servers
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        hcs.sync({port: Target("default/web", 1)}, ("127.0.0.1",))
        assert len(reported) == 1
        service, reason, message = reported[0]
        assert (service, reason) == ("default/web", "FailedToStartServiceHealthcheck")
        assert message.startswith(
            f'node node-1 failed to start healthcheck "default/web" on port {port}: '
        )
    # Freed: the next sync binds it.
    hcs.sync({port: Target("default/web", 1)}, ("127.0.0.1",))
    assert get("127.0.0.1", port)[0] == 200


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_300_ports_are_served_by_one_thread_and_one_descriptor_each(servers: Any) -> None:
    """300 externalTrafficPolicy Local Services: their ports take one listening socket each and
    share one thread (a thread and four descriptors per port used up a container's 1,024)."""
    hcs, _, _ = servers
    ports: list[int] = []
    while len(ports) < 300:
        port = free_port()
        if port not in ports:
            ports.append(port)
    threads, fds = threading.active_count(), open_descriptors()
    hcs.sync({p: Target(f"default/web-{i}", i % 3) for i, p in enumerate(ports)}, ("127.0.0.1",))
    # The shared loop's own: a selector and its wake-up pair.
    assert open_descriptors() - fds <= len(ports) + 3
    assert threading.active_count() - threads <= 1
    for i, port in enumerate(ports):
        status, body, _ = get("127.0.0.1", port)
        assert (status, body["service"]["name"], body["localEndpoints"]) == (
            200 if i % 3 else 503,
            f"web-{i}",
            i % 3,
        )
    hcs.sync({}, ("127.0.0.1",))
    assert all(refused("127.0.0.1", p) for p in ports[:10])
