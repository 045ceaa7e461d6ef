"""Whatever one Service's objects or operations raise stays with that Service (issue 13 A1).

An exception is injected at each backend (IPVS, addresses, ipsets, iptables, conntrack, sysctls)
and at the planner, for the objects of one Service only: the sync returns, that Service is
marked failed, and another Service changed in the same sync is programmed in full. Over the
fake kernel (``tests.unit.fake_node``), told what to raise; what the kernel does is proven in
tests/kernel/test_dataplane_containment.py.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.core import ipset_specs
from ipvsproxy.core import plan as plan_module
from ipvsproxy.dataplane.dataplane import Dataplane, SyncResult
from ipvsproxy.kernel.fakes import FakeBackends
from tests.unit.fake_node import Node, running_node
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

BAD_IPS = ("10.96.0.20", "192.0.2.20", "192.0.2.21")
GOOD2_IP = "10.96.0.30"


class Boom(Exception):
    """Not an ApplyError nor an OSError: what pyroute2's NetlinkError or a codec bug are."""


def _mentions_bad(obj: object) -> bool:
    text = str(obj)
    return any(ip in text for ip in BAD_IPS)


def _good() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return service("good", "10.96.0.10"), [endpoint_slice("good", [endpoint("10.244.1.11")])]


def _bad(eps: list[str], external: list[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    ports = [{"name": "dns", "port": 53, "protocol": "UDP"}]
    svc = service("bad", BAD_IPS[0], ports=ports, externalIPs=external)
    sl = endpoint_slice(
        "bad", [endpoint(ip) for ip in eps], ports=[{"name": "dns", "port": 53, "protocol": "UDP"}]
    )
    return svc, [sl]


def _good2() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    svc = service("good2", GOOD2_IP, type="NodePort", externalIPs=["192.0.2.30"])
    svc["spec"]["ports"][0]["nodePort"] = 30080
    return svc, [endpoint_slice("good2", [endpoint("10.244.1.21"), endpoint("10.244.2.22")])]


def _ops_mention_bad(ops: Any) -> bool:
    return any(_mentions_bad(op) for op in ops)


def _inject_ipvs(kernel: FakeBackends) -> None:
    error = struct.error("'H' format requires 0 <= number <= 65535")
    kernel.ipvs.raise_from("apply", error, _ops_mention_bad, times=None)


def _inject_addresses(kernel: FakeBackends) -> None:
    kernel.addresses.raise_from("apply", Boom("address refused"), _ops_mention_bad, times=None)


def _inject_ipsets(kernel: FakeBackends) -> None:
    kernel.ipsets.raise_from("apply", Boom("member refused"), _ops_mention_bad, times=None)


def _inject_conntrack(kernel: FakeBackends) -> None:
    def for_bad(service: Any, live: Any, gone: Any = ()) -> bool:
        return _mentions_bad(service)

    error = Boom("NetlinkError(22, 'Invalid argument')")
    kernel.conntrack.raise_from("flush_stale", error, for_bad, times=None)


INJECT: dict[str, Callable[[FakeBackends], None]] = {
    "ipvs": _inject_ipvs,
    "addresses": _inject_addresses,
    "ipsets": _inject_ipsets,
    "conntrack": _inject_conntrack,
}


@pytest.fixture
def h(tmp_path: Path) -> Node:
    return running_node(tmp_path)


def _programmed(dp: Dataplane, service: str) -> None:
    """Everything ``service``'s plan wants is in the dataplane's record of the kernel."""
    obs, plan = dp.observed, dp.desired.plans[service]
    assert obs is not None
    for key, vs in plan.virtual_servers.items():
        assert obs.services.get(key) == vs, key
        assert dict(obs.dests.get(key, {})) == dict(plan.real_servers.get(key, {})), key
    assert set(plan.bind) <= obs.bound
    for name, entries in plan.members.items():
        assert set(entries) <= obs.members.get(name, set()), name
    if plan.bind:
        assert set(plan.bind) <= obs.members.get(ipset_specs.IPVS_IPS, set())


def _update(dp: Dataplane, name: str, obj: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    dp.update_service(f"default/{name}", obj[0], obj[1])


@pytest.mark.parametrize("backend", sorted(INJECT))
def test_an_exception_in_a_backend_fails_only_its_service_in_an_incremental_sync(
    h: Node, backend: str
) -> None:
    dp = h.dp
    _update(dp, "good", _good())
    _update(dp, "bad", _bad(["10.244.1.31", "10.244.2.32"], []))
    assert dp.sync().errors == []
    INJECT[backend](h.kernel)
    # One sync: bad loses an endpoint (a UDP real server: its conntrack entries go) and gains
    # external IPs; good2 arrives.
    _update(dp, "bad", _bad(["10.244.1.31"], list(BAD_IPS[1:])))
    _update(dp, "good2", _good2())
    result = dp.sync()
    assert set(dp.failed) == {"default/bad"}, (result, dp.failed)
    assert "default/bad" in result.failed
    _programmed(dp, "default/good2")
    _programmed(dp, "default/good")
    # The next sync goes on as usual.
    _update(dp, "good", (service("good", "10.96.0.10"), []))
    assert "default/good" not in dp.failed
    dp.sync()
    _programmed(dp, "default/good")


@pytest.mark.parametrize("backend", ["ipvs", "addresses", "ipsets"])
def test_an_exception_in_a_backend_fails_only_its_service_in_the_first_sync(
    h: Node, backend: str
) -> None:
    dp = h.dp
    INJECT[backend](h.kernel)
    _update(dp, "good", _good())
    _update(dp, "bad", _bad(["10.244.1.31"], list(BAD_IPS[1:])))
    _update(dp, "good2", _good2())
    result = dp.sync()
    assert result.full
    assert set(dp.failed) == {"default/bad"}, (result, dp.failed)
    _programmed(dp, "default/good")
    _programmed(dp, "default/good2")


def test_an_exception_from_iptables_does_not_stop_the_rest(h: Node) -> None:
    dp = h.dp
    h.kernel.iptables.raise_from("apply", Boom("iptables-restore: no such file"), times=None)
    _update(dp, "good", _good())
    _update(dp, "good2", _good2())
    result = dp.sync()
    assert any("iptables-restore" in e for e in result.errors)
    assert not result.complete  # as upstream, a sync whose rules were not written
    _programmed(dp, "default/good")
    _programmed(dp, "default/good2")


def test_an_unwritable_sysctl_does_not_stop_programming(h: Node) -> None:
    dp = h.dp
    error = PermissionError(13, "Permission denied", "/proc/sys/net/ipv4/vs/conntrack")
    h.kernel.sysctls.raise_from("ensure", error, times=None)
    _update(dp, "good", _good())
    result = dp.sync()
    assert result.complete
    _programmed(dp, "default/good")


def test_an_exception_in_the_planner_fails_only_its_service(
    h: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    dp = h.dp
    plan = plan_module.plan_service

    def raising(svc: Any, *args: Any) -> Any:
        if svc is not None and svc["metadata"]["name"] == "bad":
            raise struct.error("ushort format requires 0 <= number <= 0xffff")
        return plan(svc, *args)

    monkeypatch.setattr("ipvsproxy.dataplane.dataplane.plan_service", raising)
    _update(dp, "good", _good())
    error = dp.update_service("default/bad", *_bad(["10.244.1.31"], []))
    assert error is not None and "ushort format" in error
    assert set(dp.errors) == {"default/bad"}
    _update(dp, "good2", _good2())
    result: SyncResult = dp.sync()
    assert result.errors == []
    _programmed(dp, "default/good")
    _programmed(dp, "default/good2")


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def warn(self, service: str, reason: str, note: str) -> bool:
        self.events.append((service, reason, note))
        return True


def _proxy(dp: Dataplane, *flags: str) -> Any:
    from ipvsproxy.config import build
    from ipvsproxy.daemon.proxy import Proxy
    from ipvsproxy.servers.metrics import Metrics

    proxy: Any = Proxy(build(None, list(flags)), dp, Metrics())
    proxy.events = Recorder()
    return proxy


def _metric(proxy: Any, name: str) -> float | None:
    value: float | None = proxy.metrics.registry.get_sample_value(name)
    return value


def test_the_daemon_reports_a_failed_service_with_an_event_a_metric_and_status(
    h: Node,
) -> None:
    proxy = _proxy(h.dp)
    INJECT["ipvs"](h.kernel)
    for name, (svc, slices) in (("good", _good()), ("bad", _bad(["10.244.1.31"], []))):
        proxy.on_service(f"default/{name}", None, svc)
        for sl in slices:
            proxy.on_slice(f"default/{sl['metadata']['name']}", None, sl)
    proxy.apply_changes()
    assert [(s, r) for s, r, _ in proxy.events.events] == [("default/bad", "FailedToProgram")]
    assert "format requires" in proxy.events.events[0][2]
    assert _metric(proxy, "ipvsproxy_failed_services") == 1.0
    invalid = proxy.status_document()["invalidServices"]
    assert list(invalid) == ["default/bad"] and "failed to program" in invalid["default/bad"]
    _programmed(h.dp, "default/good")


def test_the_sync_runner_goes_on_after_a_sync_raised(h: Node) -> None:
    import threading

    proxy = _proxy(h.dp, "--ipvs-sync-period", "1h", "--ipvs-min-sync-period", "0")
    calls: list[str] = []

    def reconcile() -> SyncResult:
        calls.append("reconcile")
        if len(calls) == 1:
            raise KeyError("a bug")
        proxy.stop.set()
        return SyncResult(full=True)

    proxy.reconcile = reconcile
    proxy.apply_changes = reconcile
    proxy.changes.mark("default/x")  # work for the runner after the first sync
    runner = threading.Thread(target=proxy.run, daemon=True)
    runner.start()
    runner.join(timeout=30)
    proxy.stop.set()
    assert calls == ["reconcile", "reconcile"]
    assert _metric(proxy, "ipvsproxy_sync_errors_total") == 1.0


def test_an_exception_while_one_service_is_replanned_leaves_the_others(h: Node) -> None:
    """Whatever raises while the dataplane takes in one Service's update (past the planner:
    the desired state's bookkeeping) is that Service's error; the others are planned and
    programmed in the same sync."""
    proxy = _proxy(h.dp)
    update = h.dp.desired.update

    def raising(service: str, plan: Any) -> Any:
        if service == "default/bad":
            raise Boom("a bug")
        return update(service, plan)

    h.dp.desired.update = raising  # type: ignore[method-assign]
    for name, (svc, slices) in (("bad", _bad(["10.244.1.31"], [])), ("good", _good())):
        proxy.on_service(f"default/{name}", None, svc)
        for sl in slices:
            proxy.on_slice(f"default/{sl['metadata']['name']}", None, sl)
    result = proxy.apply_changes()
    assert result.complete and "default/bad" in h.dp.errors
    assert "a bug" in h.dp.errors["default/bad"]
    assert ("default/bad", "InvalidService") in [(s, r) for s, r, _ in proxy.events.events]
    _programmed(h.dp, "default/good")


def test_a_failed_conntrack_cleanup_is_done_again_when_its_service_is_retried(
    h: Node,
) -> None:
    """A UDP Service's stale conntrack entries whose deletion failed (a transient netlink
    error) are deleted by the Service's retry: a retry that only re-compares its virtual
    servers (unchanged since) clears the failure with the blackholing entries still there."""
    dp = h.dp
    now = [1000.0]
    dp.failures.clock = lambda: now[0]
    _update(dp, "bad", _bad(["10.244.1.31", "10.244.2.32"], []))
    assert dp.sync().errors == []
    conntrack = h.kernel.conntrack
    calls, flushes = conntrack.calls["flush_stale"], len(conntrack.flushes)
    error = Boom("NetlinkError(105, 'No buffer space available')")
    conntrack.raise_from("flush_stale", error)  # the next call only
    _update(dp, "bad", _bad([], []))  # its last endpoints go: their flows with them
    dp.sync()
    assert set(dp.failed) == {"default/bad"}
    now[0] += 1.0  # its retry is due
    dp.sync()
    assert conntrack.calls["flush_stale"] - calls == 2, conntrack.flushes
    (retried,) = conntrack.flushes[flushes:]  # the first raised before it flushed
    assert retried[1:] == (frozenset(), frozenset({("10.244.1.31", 53), ("10.244.2.32", 53)}))
    assert dp.failed == {}
