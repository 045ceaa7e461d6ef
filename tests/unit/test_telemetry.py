"""Telemetry records a sync from its SyncResult and the dataplane's Snapshot alone: cumulative
counts become counter increments, sizes become gauges, and only a sync that ran to its end
counts as done."""

from __future__ import annotations

import re
from dataclasses import replace

from ipvsproxy.daemon.changes import Trigger
from ipvsproxy.daemon.telemetry import Telemetry
from ipvsproxy.dataplane.dataplane import SyncResult
from ipvsproxy.dataplane.drain import FlushRun
from ipvsproxy.dataplane.snapshot import Snapshot
from ipvsproxy.servers.metrics import Metrics

SNAPSHOT = Snapshot(
    operations={("add_service", "ok"): 3, ("add_dest", "error"): 1},
    restore_failures={4: 0},
    state_write_failures=1,
    draining=2,
    no_local_endpoints={("external", 4): 1},
    failed_services=1,
    kernel_problems=0,
)


def _sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    value: float | None = metrics.registry.get_sample_value(name, labels)
    return value


def test_cumulative_counts_are_exported_as_what_they_grew_by() -> None:
    metrics = Metrics()
    telemetry = Telemetry(metrics, warn=lambda *_a: None, wall=lambda: 100.0)
    telemetry.record(SyncResult(full=True), SNAPSHOT, taken={})
    later = replace(
        SNAPSHOT,
        operations={("add_service", "ok"): 5, ("add_dest", "error"): 1},
        restore_failures={4: 0, 6: 1},
        draining=0,
    )
    telemetry.record(SyncResult(full=False), later, taken={})
    ops = "ipvsproxy_netlink_operations_total"
    assert _sample(metrics, ops, kind="add_service", outcome="ok") == 5.0
    assert _sample(metrics, ops, kind="add_dest", outcome="error") == 1.0
    restore = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
    assert _sample(metrics, restore, ip_family="IPv6") == 1.0
    assert _sample(metrics, restore, ip_family="IPv4") is None  # as upstream: none yet
    assert _sample(metrics, "ipvsproxy_state_file_write_failures_total") == 1.0
    assert _sample(metrics, "ipvsproxy_graceful_termination_real_servers") == 0.0
    assert _sample(metrics, "ipvsproxy_failed_services") == 1.0


def test_a_sync_that_ran_to_its_end_is_done_at_the_wall_time() -> None:
    metrics = Metrics()
    warnings: list[tuple[str, str, str]] = []
    telemetry = Telemetry(metrics, warn=lambda *a: warnings.append(a), wall=lambda: 100.0)
    result = SyncResult(full=False, failed={"default/bad": "refused", "": "a deleted one"})
    taken = {"default/web": [Trigger(97.5, 4), Trigger(99.0, 4)], "default/bad": []}
    assert telemetry.record(result, SNAPSHOT, taken=taken) == 100.0
    assert warnings == [("default/bad", "FailedToProgram", "refused")]  # deleted: no Event
    last = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
    assert _sample(metrics, last, ip_family="IPv4") == 100.0
    assert _sample(metrics, last, ip_family="IPv6") is None  # not served
    latency = "kubeproxy_network_programming_duration_seconds"
    assert _sample(metrics, f"{latency}_count", ip_family="IPv4") == 2.0  # each trigger time
    assert _sample(metrics, f"{latency}_sum", ip_family="IPv4") == 3.5


def test_a_sync_that_did_not_run_to_its_end_is_not_done() -> None:
    metrics = Metrics()
    telemetry = Telemetry(metrics, warn=lambda *_a: None, wall=lambda: 100.0)
    result = SyncResult(full=True, errors=["iptables-restore: failed"], complete=False)
    assert telemetry.record(result, SNAPSHOT, taken={"default/web": [Trigger(97.5, 4)]}) is None
    assert _sample(metrics, "ipvsproxy_sync_errors_total") == 1.0
    assert _sample(metrics, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") is None
    assert _sample(metrics, "kubeproxy_network_programming_duration_seconds_count") is None


def test_no_local_endpoints_are_set_for_each_policy_and_served_family() -> None:
    """Upstream's every sync sets both policies of its family, 0 included; ipvsproxy's one
    sync sets them for each family it serves."""
    metrics = Metrics()
    telemetry = Telemetry(metrics, warn=lambda *_a: None, families=(4, 6))
    counts = {("external", 4): 2, ("internal", 6): 1}
    telemetry.record(SyncResult(full=True), replace(SNAPSHOT, no_local_endpoints=counts), {})
    name = "kubeproxy_sync_proxy_rules_no_local_endpoints_total"
    got = {
        (policy, family): _sample(metrics, name, traffic_policy=policy, ip_family=family)
        for policy in ("internal", "external")
        for family in ("IPv4", "IPv6")
    }
    assert got == {
        ("internal", "IPv4"): 0.0,
        ("external", "IPv4"): 2.0,
        ("internal", "IPv6"): 1.0,
        ("external", "IPv6"): 0.0,
    }


def test_one_sync_is_recorded_for_every_served_family() -> None:
    """Upstream's dual-stack proxy syncs each family's proxier; ipvsproxy's one sync covers
    both, so dashboards that read either family's series see it."""
    metrics = Metrics()
    telemetry = Telemetry(metrics, warn=lambda *_a: None, wall=lambda: 100.0, families=(4, 6))
    telemetry.queued()
    taken = {"default/web": [Trigger(99.0, 6)]}
    telemetry.record(SyncResult(full=True, seconds=0.003), SNAPSHOT, taken)
    for family in ("IPv4", "IPv6"):
        hist = "kubeproxy_sync_proxy_rules_duration_seconds"
        assert _sample(metrics, f"{hist}_count", ip_family=family) == 1.0
        assert _sample(metrics, f"{hist}_bucket", ip_family=family, le="0.004") == 1.0
        assert _sample(metrics, f"{hist}_bucket", ip_family=family, le="0.002") == 0.0
        last = "kubeproxy_sync_proxy_rules_last_timestamp_seconds"
        assert _sample(metrics, last, ip_family=family) == 100.0
        queued = "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds"
        assert _sample(metrics, queued, ip_family=family) == 100.0
    latency = "kubeproxy_network_programming_duration_seconds_count"
    assert _sample(metrics, latency, ip_family="IPv6") == 1.0  # the trigger's own family
    assert _sample(metrics, latency, ip_family="IPv4") is None


def test_the_exposition_has_upstreams_buckets_and_no_created_series() -> None:
    metrics = Metrics()
    telemetry = Telemetry(metrics, warn=lambda *_a: None, wall=lambda: 100.0)
    telemetry.record(SyncResult(full=True), SNAPSHOT, {"default/web": [Trigger(99.0, 4)]})
    text = metrics.exposition().decode()
    assert "_created" not in text
    latency = "kubeproxy_network_programming_duration_seconds_bucket"
    bounds = re.findall(rf'^{latency}{{ip_family="IPv4",le="([^"]+)"}}', text, re.M)
    # MergeBuckets(Linear(0.25, 0.25, 2), Linear(1, 1, 59), Linear(60, 5, 12),
    # Linear(120, 30, 7)) after MergeBuckets' own 0, written as Go writes them.
    expected = ["0", "0.25", "0.5", *map(str, range(1, 60)), *map(str, range(60, 120, 5))]
    assert bounds == [*expected, *map(str, range(120, 301, 30)), "+Inf"]
    sync = "kubeproxy_sync_proxy_rules_duration_seconds_bucket"
    bounds = re.findall(rf'^{sync}{{ip_family="IPv4",le="([^"]+)"}}', text, re.M)
    assert bounds == [str(0.001 * 2**i) for i in range(15)] + ["+Inf"]
    assert bounds[-2] == "16.384"


def test_each_familys_stale_udp_flush_is_a_conntrack_reconciler_run() -> None:
    metrics = Metrics()
    telemetry = Telemetry(metrics, warn=lambda *_a: None, families=(4, 6))
    runs = [FlushRun(4, 0.003, 2), FlushRun(6, 0.0005, 0)]
    telemetry.record(SyncResult(full=False, conntrack=runs), SNAPSHOT, {})
    hist = "kubeproxy_conntrack_reconciler_sync_duration_seconds"
    deleted = "kubeproxy_conntrack_reconciler_deleted_entries_total"
    assert _sample(metrics, f"{hist}_count", ip_family="IPv4") == 1.0
    assert _sample(metrics, f"{hist}_bucket", ip_family="IPv4", le="0.004") == 1.0
    assert _sample(metrics, f"{hist}_bucket", ip_family="IPv6", le="0.001") == 1.0
    assert _sample(metrics, deleted, ip_family="IPv4") == 2.0
    assert _sample(metrics, deleted, ip_family="IPv6") == 0.0  # upstream adds 0 too


def test_restores_are_operations_and_their_failures_are_counted_apart() -> None:
    metrics = Metrics()
    telemetry = Telemetry(metrics, warn=lambda *_a: None, families=(4, 6))
    snapshot = replace(
        SNAPSHOT,
        operations={("restore", "ok"): 2, ("restore", "error"): 1},
        restore_failures={4: 0, 6: 1},
    )
    telemetry.record(SyncResult(full=True), snapshot, {})
    ops = "ipvsproxy_netlink_operations_total"
    assert _sample(metrics, ops, kind="restore", outcome="ok") == 2.0
    assert _sample(metrics, ops, kind="restore", outcome="error") == 1.0
    restore = "kubeproxy_sync_proxy_rules_iptables_restore_failures_total"
    assert _sample(metrics, restore, ip_family="IPv6") == 1.0
    assert _sample(metrics, restore, ip_family="ok") is None
