"""ipvsproxy's /metrics has upstream kube-proxy's series (IPVS mode) with their names, types,
label names and values, buckets and help, as golden/metrics-kube-proxy-ipvs.txt lists them
(itself checked against the real kube-proxy in the lab: tests/kernel/test_peers.py), and
besides them only its own (ipvsproxy_*) and its runtime's (python_*)."""

from __future__ import annotations

import platform
import time
from pathlib import Path

from ipvsproxy import __version__
from ipvsproxy.daemon.changes import Trigger
from ipvsproxy.daemon.telemetry import Telemetry
from ipvsproxy.dataplane.dataplane import SyncResult
from ipvsproxy.dataplane.drain import FlushRun
from ipvsproxy.dataplane.snapshot import Snapshot
from ipvsproxy.servers.metrics import Metrics
from ipvsproxy.servers.process_metrics import UNLIMITED, ProcessExtras
from tests.unit.metric_shapes import Shape, golden, sample_value, shapes, upstream_names

SNAPSHOT = Snapshot(
    operations={("add_dest", "ok"): 3},
    restore_failures={4: 1, 6: 1},
    state_write_failures=0,
    draining=0,
    no_local_endpoints={("external", 6): 1},
    failed_services=0,
    kernel_problems=0,
)


def exposed() -> tuple[Metrics, str]:
    """Every series after what makes each appear: a change of each kind, a dual-stack sync
    that ran to its end with a stale UDP flush and a restore failure in each family, and a
    probe of /healthz and /livez."""
    metrics = Metrics()
    telemetry = Telemetry(metrics, warn=lambda *_a: None, families=(4, 6))
    metrics.service_total.inc(2)
    metrics.endpoint_total.inc()
    telemetry.queued()
    telemetry.changes_pending(1, 1)
    now = time.time()
    result = SyncResult(full=True, conntrack=[FlushRun(4, 0.001, 1), FlushRun(6, 0.002, 0)])
    telemetry.record(result, SNAPSHOT, {"default/web": [Trigger(now - 1, 4), Trigger(now, 6)]})
    metrics.health_answered("healthz", 200)
    metrics.health_answered("livez", 200)
    return metrics, metrics.exposition().decode()


def test_upstreams_series_have_upstreams_names_types_labels_buckets_and_help() -> None:
    found = shapes(exposed()[1])
    ours = {name: found[name].key() for name in upstream_names(found)}
    assert ours == {name: shape.key() for name, shape in golden().items()}


def test_every_other_series_is_ipvsproxys_own_or_its_runtimes() -> None:
    found = shapes(exposed()[1])
    others = set(found) - set(golden())
    assert others and all(n.startswith(("ipvsproxy_", "python_")) for n in others), others


def test_label_values_are_upstreams() -> None:
    found = shapes(exposed()[1])
    for name in upstream_names(found):
        shape: Shape = found[name]
        if "ip_family" in shape.labels:
            assert shape.values["ip_family"] == {"IPv4", "IPv6"}, name
    policies = found["kubeproxy_sync_proxy_rules_no_local_endpoints_total"].values
    assert policies["traffic_policy"] == {"internal", "external"}
    assert found["kubeproxy_proxy_healthz_total"].values["code"] == {"200"}


def test_no_created_series() -> None:
    assert "_created" not in exposed()[1]


def test_build_info_names_ipvsproxy() -> None:
    """kubernetes_build_info with upstream's labels, filled with ipvsproxy's own version; no
    Go: go_version is empty, compiler names the Python implementation."""
    metrics, _ = exposed()
    (family,) = [f for f in metrics.registry.collect() if f.name == "kubernetes_build_info"]
    (sample,) = family.samples
    major, minor = __version__.split(".")[:2]
    assert sample.value == 1.0
    assert sample.labels == {
        "major": major,
        "minor": minor,
        "git_version": f"v{__version__}",
        "git_commit": "",
        "git_tree_state": "",
        "build_date": "",
        "go_version": "",
        "compiler": platform.python_implementation().lower(),
        "platform": sample.labels["platform"],
    }
    assert sample.labels["platform"].startswith("linux/")


def test_the_go_process_series_read_procfs_as_upstreams_collector(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "netstat").write_text(
        "TcpExt: SyncookiesSent\nTcpExt: 0\n"
        "IpExt: InNoRoutes InOctets OutOctets\nIpExt: 0 1234 567\n"
    )
    samples = {s.name: s.value for f in ProcessExtras(tmp_path).collect() for s in f.samples}
    assert samples["process_network_receive_bytes_total"] == 1234.0
    assert samples["process_network_transmit_bytes_total"] == 567.0
    assert samples["process_virtual_memory_max_bytes"] > 0
    names = {s.name for f in ProcessExtras(tmp_path / "gone").collect() for s in f.samples}
    assert names == {"process_virtual_memory_max_bytes"}  # no netstat: left out
    assert UNLIMITED == 2**64 - 1


def test_a_family_without_series_is_not_exposed() -> None:
    """Go's client exposes a labelled family once it has a series; prometheus_client would
    write its HELP and TYPE lines alone."""
    text = Metrics().exposition().decode()
    assert "kubeproxy_network_programming_duration_seconds" not in text
    assert "kubeproxy_sync_proxy_rules_endpoint_changes_total 0" in text  # unlabelled: 0


def test_a_series_is_found_by_its_labels_in_any_order() -> None:
    text = 'x_total{b="2",a="1"} 3.0\nx_total{a="1"} 4.0\n'
    assert sample_value(text, "x_total", a="1", b="2") == 3.0
    assert sample_value(text, "x_total", a="1") == 4.0
    assert sample_value(text, "x_total", a="2") is None
