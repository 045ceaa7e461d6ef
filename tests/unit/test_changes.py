"""The change tracker and what the daemon counts of the informers' changes, as upstream's
ServiceChangeTracker and EndpointsChangeTracker (pkg/proxy/servicechangetracker.go,
endpointschangetracker.go) count them in pkg/proxy/metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ipvsproxy.config import build
from ipvsproxy.core.plan import PlanConfig
from ipvsproxy.daemon.changes import TRIGGER_ANNOTATION, ChangeTracker, Trigger
from ipvsproxy.daemon.proxy import Proxy
from ipvsproxy.servers.metrics import Metrics
from tests.unit.fake_node import node
from tests.unit.k8s_objects import endpoint, endpoint_slice, service


def test_service_and_slice_changes_are_pending_apart() -> None:
    """Upstream's service-changes gauge counts the Services with a Service change pending;
    its endpoint-changes gauge, every slice change pending. Both drop to 0 when a sync takes
    them; a mark for another reason (the Node) is neither."""
    changes = ChangeTracker()
    changes.mark_service("default/a")
    changes.mark_service("default/a")
    changes.mark_slice("default/b", 4)
    changes.mark_slice("default/b", 4)
    changes.mark_slice("default/a", 6)
    changes.mark("default/c")
    assert changes.pending_changes() == (1, 3)
    assert changes.pending() == 3
    assert sorted(changes.take()) == ["default/a", "default/b", "default/c"]
    assert changes.pending_changes() == (0, 0)
    assert changes.pending() == 0


def test_a_mark_keeps_every_trigger_time_of_its_slices_after_the_start() -> None:
    """As upstream's EndpointsChangeTracker: each slice change's trigger time, when later
    than the tracker's start, is observed once; a slice's deletion forgets the Service's
    trigger times of its family (upstream: "by-definition coming from the time of last
    update")."""
    changes = ChangeTracker(started=100.0)
    changes.mark_slice("default/a", 4, 90.0)  # before the start: the initial list's
    changes.mark_slice("default/a", 4, 105.0)
    changes.mark_slice("default/a", 6, 106.0)
    changes.mark_slice("default/a", 4, 107.0)
    changes.mark_slice("default/b", 4, 108.0)
    changes.mark_slice("default/b", 4, None, deleted=True)
    changes.mark("default/c")
    assert changes.take() == {
        "default/a": [Trigger(105.0, 4), Trigger(106.0, 6), Trigger(107.0, 4)],
        "default/b": [],
        "default/c": [],
    }


def _proxy(tmp_path: Path, families: tuple[int, ...]) -> Any:
    dp = node(tmp_path, plan_config=PlanConfig(families=families)).dp
    return Proxy(build(None, []), dp, Metrics())


def _value(proxy: Any, name: str) -> float:
    value: float = proxy.metrics.registry.get_sample_value(name)
    return value


def test_each_served_family_counts_a_service_change_as_upstreams_trackers(
    tmp_path: Path,
) -> None:
    """Upstream's dual-stack proxy gives every Service event to both families' trackers,
    and each counts it; an EndpointSlice goes to its own family's tracker only (FQDN to
    none)."""
    proxy = _proxy(tmp_path, (4, 6))
    proxy.on_service("default/web", None, service("web", "10.96.0.10"))
    sl6 = {**endpoint_slice("web", [endpoint("fd00::5")], name="web-6"), "addressType": "IPv6"}
    fqdn = {**endpoint_slice("web", [endpoint("a.example")], name="web-f"), "addressType": "FQDN"}
    for key, sl in (("web-4", endpoint_slice("web", [endpoint("10.244.1.5")])), ("web-6", sl6)):
        proxy.on_slice(f"default/{key}", None, sl)
    proxy.on_slice("default/web-f", None, fqdn)
    assert _value(proxy, "kubeproxy_sync_proxy_rules_service_changes_total") == 2.0
    assert _value(proxy, "kubeproxy_sync_proxy_rules_endpoint_changes_total") == 2.0
    assert _value(proxy, "kubeproxy_sync_proxy_rules_service_changes_pending") == 1.0
    assert _value(proxy, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == 2.0
    proxy.apply_changes()
    assert _value(proxy, "kubeproxy_sync_proxy_rules_service_changes_pending") == 0.0
    assert _value(proxy, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == 0.0


def test_an_ipv6_slice_counts_nowhere_where_ipv6_is_not_served(tmp_path: Path) -> None:
    proxy = _proxy(tmp_path, (4,))
    proxy.on_service("default/web", None, service("web", "10.96.0.10"))
    sl6 = {**endpoint_slice("web", [endpoint("fd00::5")], name="web-6"), "addressType": "IPv6"}
    proxy.on_slice("default/web-6", None, sl6)
    assert _value(proxy, "kubeproxy_sync_proxy_rules_service_changes_total") == 1.0
    assert _value(proxy, "kubeproxy_sync_proxy_rules_endpoint_changes_total") == 0.0
    assert _value(proxy, "kubeproxy_sync_proxy_rules_endpoint_changes_pending") == 0.0


def test_a_slice_change_carries_its_trigger_time_and_family(tmp_path: Path) -> None:
    proxy = _proxy(tmp_path, (4, 6))
    proxy.changes.started = 0.0
    sl = endpoint_slice("web", [endpoint("fd00::5")], name="web-6")
    sl = {**sl, "addressType": "IPv6"}
    sl["metadata"] = {**sl["metadata"], "annotations": {TRIGGER_ANNOTATION: "2026-12-02T15:04:05Z"}}
    proxy.on_slice("default/web-6", None, sl)
    assert proxy.changes.take() == {"default/web": [Trigger(1796223845.0, 6)]}


def test_created_and_deleted_services_leave_the_tracker_empty(tmp_path: Path) -> None:
    """Nothing of a Service outlives it: its object, its slices' bucket and its marks go once
    it and its slices are deleted and a sync took the marks (deletions in either order)."""
    proxy = _proxy(tmp_path, (4,))
    for i in range(200):
        name, key = f"s{i}", f"default/s{i}"
        svc = service(name, f"10.96.{i // 250}.{i % 250 + 1}")
        slices = [endpoint_slice(name, [endpoint("10.244.1.5")], name=f"{name}-{n}") for n in "ab"]
        proxy.on_service(key, None, svc)
        for sl in slices:
            proxy.on_slice(f"default/{sl['metadata']['name']}", None, sl)
        proxy.apply_changes()
        if i % 2:
            proxy.on_service(key, svc, None)
        for sl in slices:
            proxy.on_slice(f"default/{sl['metadata']['name']}", sl, None)
        if not i % 2:
            proxy.on_service(key, svc, None)
        proxy.apply_changes()
    changes = proxy.changes
    assert (changes.services, changes.slices, changes.dirty) == ({}, {}, {})
    assert (changes.service_changes, changes.slice_changes) == (set(), 0)


def test_a_slice_moved_to_another_service_leaves_the_first(tmp_path: Path) -> None:
    """A slice whose service-name label changes is the first Service's no more: its bucket
    goes and both Services are re-planned."""
    proxy = _proxy(tmp_path, (4,))
    first = endpoint_slice("a", [endpoint("10.244.1.5")], name="custom")
    proxy.on_slice("default/custom", None, first)
    proxy.changes.take()
    moved = endpoint_slice("b", [endpoint("10.244.1.5")], name="custom")
    proxy.on_slice("default/custom", first, moved)
    assert list(proxy.changes.slices) == ["default/b"]
    assert sorted(proxy.changes.take()) == ["default/a", "default/b"]
