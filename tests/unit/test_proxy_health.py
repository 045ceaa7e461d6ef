"""/healthz follows upstream's pkg/proxy/healthcheck/proxy_health.go; /livez and /readyz are
the kubelet's (the sync loop is alive; the first full sync ended).

Upstream: healthy while starting (the sync loop marks itself updated when it starts, and
nothing is queued before the initial lists are done); a change queues an update unless one is
queued already; every sync that runs to its end marks the proxier updated and clears the queue,
per-object failures included (only iptables-restore failing stops a sync short of it); unhealthy
once the oldest queued update is older than the timeout. /livez: unhealthy once the oldest
change queued is older than the timeout and no sync ended since. Over the fake kernel
(``tests.unit.fake_node``); a refused operation is reported (Event, metric, status), not node
ill-health.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.config import build
from ipvsproxy.daemon.proxy import Proxy
from ipvsproxy.dataplane.dataplane import SyncResult
from ipvsproxy.servers.healthz import HealthState
from ipvsproxy.servers.healthz import routes as health_routes
from ipvsproxy.servers.metrics import Metrics
from tests.unit.fake_node import Node, refuse_ipvs, running_node
from tests.unit.k8s_objects import endpoint, endpoint_slice, service
from tests.unit.test_containment import Boom, Recorder

TIMEOUT = 2 * 30.0  # 2 x the default syncPeriod


class Synced:
    """An informer whose initial list is done (or not)."""

    def __init__(self, name: str, done: bool = True) -> None:
        self.name = name
        self.synced = threading.Event()
        if done:
            self.synced.set()


@pytest.fixture
def h(tmp_path: Path) -> Node:
    return running_node(tmp_path)


def _proxy(h: Node) -> Any:
    proxy: Any = Proxy(build(None, []), h.dp, Metrics())
    proxy.events = Recorder()
    proxy.informers = [Synced("services"), Synced("endpointslices")]
    return proxy


def _add(proxy: Any, name: str, ip: str) -> None:
    sl = endpoint_slice(name, [endpoint("10.244.1.11")])
    proxy.on_service(f"default/{name}", None, service(name, ip))
    proxy.on_slice(f"default/{sl['metadata']['name']}", None, sl)


def _code(proxy: Any, after: float) -> int:
    """/livez's status ``after`` seconds from now."""
    code: int = proxy.health.live(now=time.time() + after)[0]
    return code


def test_healthy_while_starting_as_upstream() -> None:
    state = HealthState(timeout=TIMEOUT)
    assert state.status(node_check=True)[0] == 200
    assert state.status(node_check=False, now=time.time() + 10 * TIMEOUT)[0] == 200


def test_changes_before_the_initial_lists_are_done_queue_nothing(h: Node) -> None:
    proxy = _proxy(h)
    proxy.informers = [Synced("services", done=False), Synced("endpointslices")]
    _add(proxy, "web", "10.96.0.10")
    assert _code(proxy, TIMEOUT + 1) == 200
    queued = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"
    assert proxy.metrics.registry.get_sample_value(queued, {"ip_family": "IPv4"}) is None
    proxy.informers[0].synced.set()
    _add(proxy, "web2", "10.96.0.11")  # now it queues
    assert _code(proxy, 1) == 200
    assert _code(proxy, TIMEOUT + 1) == 503
    assert proxy.metrics.registry.get_sample_value(queued, {"ip_family": "IPv4"}) > 0


def test_the_runner_marks_the_proxy_updated_when_it_starts(h: Node) -> None:
    proxy = _proxy(h)
    proxy.informers = [Synced("services", done=False), Synced("endpointslices")]
    runner = threading.Thread(target=proxy.run, daemon=True)
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while proxy.health.last_updated is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proxy.health.last_updated is not None
    finally:
        proxy.stop.set()
        runner.join(timeout=10)


def test_a_sync_with_a_refused_operation_keeps_the_proxy_healthy(h: Node) -> None:
    proxy = _proxy(h)
    refuse_ipvs(h.kernel, "10.96.0.20")
    _add(proxy, "good", "10.96.0.10")
    proxy.on_service("default/bad", None, service("bad", "10.96.0.20"))
    result = proxy.apply_changes()
    assert set(result.failed) == {"default/bad"}
    assert _code(proxy, TIMEOUT + 1) == 200
    # Reported instead: a Warning Event, the gauge, the status.
    assert [(s, r) for s, r, _ in proxy.events.events] == [("default/bad", "FailedToProgram")]
    assert proxy.metrics.registry.get_sample_value("ipvsproxy_failed_services") == 1.0
    doc = proxy.status_document()
    assert "default/bad" in doc["invalidServices"]
    # What kube-ipvs0 should hold, for status --all's drift.
    assert "10.96.0.10" in doc["addresses"]
    assert proxy.last_sync is not None


def test_a_change_queued_during_a_sync_is_cleared_by_its_end_as_upstream(h: Node) -> None:
    proxy = _proxy(h)
    _add(proxy, "web", "10.96.0.10")
    sync = h.dp.sync

    def sync_while_a_change_arrives() -> SyncResult:
        _add(proxy, "web2", "10.96.0.11")
        return sync()

    h.dp.sync = sync_while_a_change_arrives  # type: ignore[method-assign]
    proxy.apply_changes()
    assert proxy.changes.dirty  # web2 waits for the next sync
    assert _code(proxy, TIMEOUT + 1) == 200


def _healthz(proxy: Any, after: float) -> int:
    """/healthz's status ``after`` seconds from now."""
    code: int = proxy.health.status(node_check=True, now=time.time() + after)[0]
    return code


def test_rules_that_cannot_be_written_turn_healthz_unhealthy_but_not_livez(h: Node) -> None:
    """/healthz as upstream's failed iptables-restore: that sync does not mark the proxier
    updated. /livez means "the sync loop is alive": a sync ended, so the loop is (a restart
    would only meet the same kernel again)."""
    proxy = _proxy(h)
    error = Boom("iptables-restore: Resource temporarily unavailable")
    h.kernel.iptables.raise_from("apply", error, times=None)
    _add(proxy, "web", "10.96.0.10")
    result = proxy.apply_changes()
    assert not result.complete
    assert _healthz(proxy, 1) == 200
    assert _healthz(proxy, TIMEOUT + 1) == 503
    assert _code(proxy, TIMEOUT + 1) == 200
    # A change that no sync picks up within the timeout: the loop is stuck.
    _add(proxy, "web2", "10.96.0.11")
    assert _code(proxy, 1) == 200
    assert _code(proxy, TIMEOUT + 1) == 503
    proxy.apply_changes()  # the loop goes on, its rules still refused
    assert _code(proxy, TIMEOUT + 1) == 200
    assert _healthz(proxy, TIMEOUT + 1) == 503


def _ready(proxy: Any) -> int:
    code: int = proxy.health.ready()[0]
    return code


def test_readyz_waits_for_the_first_full_sync_and_ignores_the_nodes_eligibility(
    h: Node,
) -> None:
    """/readyz (the startup and readiness probes'): 503 until the first full sync ended, so
    liveness never judges the first sync of a big cluster; then 200 while the loop is alive,
    also on a node being drained (whose /healthz is 503 for load balancers): a draining node's
    pod must not count as unavailable in a rollout."""
    proxy = _proxy(h)
    proxy.health.updated()  # the runner starts: /healthz and /livez are 200 (upstream)
    assert _ready(proxy) == 503
    assert _code(proxy, 1) == 200
    h.dp.reconcile()  # the dataplane has read the kernel: the next sync is incremental
    _add(proxy, "web", "10.96.0.10")
    assert not proxy.apply_changes().full
    assert _ready(proxy) == 503
    proxy.reconcile()
    assert _ready(proxy) == 200
    proxy.health.node_eligible = False
    assert _healthz(proxy, 1) == 503
    assert _ready(proxy) == 200
    assert health_routes(proxy.health)["/readyz"]()[0] == 200


def test_a_full_sync_that_fails_still_ends_the_startup(h: Node) -> None:
    """Startup ends when the first full sync ended, whatever its outcome: the loop is alive
    and liveness takes over (a restart would not make the kernel take the rules)."""
    proxy = _proxy(h)
    h.kernel.iptables.raise_from("apply", Boom("iptables-restore: no"), times=None)
    _add(proxy, "web", "10.96.0.10")
    assert not proxy.reconcile().complete
    assert _ready(proxy) == 200


def test_healthz_names_the_ip_families_the_node_does_not_serve() -> None:
    state = HealthState(timeout=60.0)
    assert "unservedIPFamilies" not in state.status(node_check=True)[1]
    state.unserved = {"IPv6": "IPv6 is disabled (net.ipv6.conf.all.disable_ipv6 = 1)"}
    code, body = state.status(node_check=True)
    assert code == 200  # upstream serves the families it can: not a failure
    assert body["unservedIPFamilies"] == {"IPv6": state.unserved["IPv6"]}


def test_healthz_and_livez_answers_are_counted_by_code() -> None:
    """As upstream's healthzHandler and livezHandler: kubeproxy_proxy_healthz_total and
    kubeproxy_proxy_livez_total by response code; the health-check node ports, which ask the
    same state, count nowhere."""
    metrics = Metrics()
    state = HealthState(timeout=TIMEOUT)
    routes = health_routes(state, metrics.health_answered)
    assert routes["/healthz"]()[0] == 200
    assert routes["/livez"]()[0] == 200
    state.node_eligible = False
    assert routes["/healthz"]()[0] == 503
    state.status(node_check=False)  # a health-check node port's question
    count = metrics.registry.get_sample_value
    assert count("kubeproxy_proxy_healthz_total", {"code": "200"}) == 1.0
    assert count("kubeproxy_proxy_healthz_total", {"code": "503"}) == 1.0
    assert count("kubeproxy_proxy_livez_total", {"code": "200"}) == 1.0
    assert count("kubeproxy_proxy_livez_total", {"code": "503"}) is None


def test_healthz_body_has_upstreams_healthy_and_per_family_status() -> None:
    """Upstream's ProxyHealth JSON: ``healthy`` always, ``status`` with each family's proxier
    (its lastUpdated and health) once it was marked updated; one proxier stands for both
    families here, so each served family shows the same."""
    state = HealthState(timeout=TIMEOUT, families=("IPv4", "IPv6"))
    code, body = state.status(node_check=True)
    assert (code, body["healthy"]) == (200, True) and "status" not in body
    state.updated(now=1000.0)
    state.queued(now=1001.0)
    code, body = state.status(node_check=True, now=1001.0 + TIMEOUT)
    assert (code, body["healthy"]) == (503, False)
    updated = body["lastUpdated"]
    assert body["status"] == {
        "IPv4": {"lastUpdated": updated, "healthy": False},
        "IPv6": {"lastUpdated": updated, "healthy": False},
    }
    state.node_eligible = False
    state.updated(now=2000.0)
    code, body = state.status(node_check=True, now=2001.0)
    # Upstream: ``healthy`` is the proxiers' health; the node's eligibility is its own field.
    assert (code, body["healthy"], body["nodeEligible"]) == (503, True, False)
    assert body["status"]["IPv4"]["healthy"] is True
