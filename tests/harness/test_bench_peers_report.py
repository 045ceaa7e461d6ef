"""The side-by-side report is computed from bench.peers's JSON as it says (medians, p95, mean
CPU per change, ratios against each peer), and /proc/net/ip_vs is read as the kernel writes it."""

from __future__ import annotations

from typing import Any

import pytest

from bench import kernel_view, peers_report


def run(latency: float, cpu: float, cold: float, rss: float) -> dict[str, Any]:
    changes = {
        kind: [[latency * (1 + i / 20), cpu] for i in range(20)] for kind in peers_report.KINDS
    }
    return {
        "virtual_servers": 10,
        "real_servers": 100,
        "cold_s": cold,
        "cold_cpu_s": cold / 2,
        "changes": changes,
        "steady": {"idle_cpu_s_per_min": 0.5, "busy_cpu_s_per_min": 2.0},
        "cold_peak_rss_mib": rss - 10,
        "peak_rss_mib": rss,
        "restart": {
            "converge_s": 1.0,
            "ipvs_changed": 0,
            "connection": "survived",
            "peak_rss_mib": rss - 5,
        },
    }


def data() -> dict[str, Any]:
    return {
        "sizes": [
            {
                "services": 5000,
                "endpoints": 10,
                "runs": {
                    "ipvsproxy": [run(0.01, 0.001, 10, 100), run(0.03, 0.003, 12, 110)],
                    "kube-proxy": [run(2.0, 1.0, 100, 80), run(2.0, 1.0, 100, 80)],
                    "kube-router": [run(0.5, 0.5, 50, 120), run(0.5, 0.5, 50, 120)],
                },
            }
        ]
    }


def test_latency_is_the_median_and_p95_over_every_change_of_the_kinds() -> None:
    runs = data()["sizes"][0]["runs"]["kube-proxy"]
    median, p95 = peers_report.latency(runs, ["endpoint added"])
    # 40 values: 2.0 x (1.0, 1.05 .. 1.95), each twice; the p95 is the 38th
    assert median == pytest.approx(2.0 * 1.475)
    assert p95 == pytest.approx(2.0 * 1.9)


def test_ratios_are_ipvsproxy_over_the_peer() -> None:
    size = data()["sizes"][0]
    r = peers_report.ratios(size, "kube-proxy")
    ours = peers_report.latency(size["runs"]["ipvsproxy"], peers_report.ENDPOINT_KINDS)[0]
    assert r[1] == pytest.approx(ours / (2.0 * 1.475))
    assert r[2] == pytest.approx(0.002 / 1.0)
    assert r[3] == pytest.approx(11 / 100)
    assert r[4] == pytest.approx(105 / 80)


def test_the_targets_table_says_met_or_missed_against_each_peer() -> None:
    rows = peers_report.targets_table(data()["sizes"][0])
    assert rows[0].endswith("| kube-proxy | kube-router |")
    cold = next(r for r in rows if r.startswith("| 3 |"))
    assert "0.110 (met)" in cold and "0.220 (**missed**)" in cold
    rss = next(r for r in rows if r.startswith("| 4 |"))
    assert "1.312 (**missed**)" in rss and "0.875 (met)" in rss
    size = data()["sizes"][0]
    size["runs"]["kube-proxy"] = [run(2.0, 10.0, 100, 80)]
    cpu = next(r for r in peers_report.targets_table(size) if r.startswith("| 2 |"))
    assert "| 2.0e-04 (met) |" in cpu  # 0.002 / 10, not rounded to 0.000


def test_the_size_table_has_a_column_per_system_and_ranges_over_runs() -> None:
    rows = peers_report.size_table(data()["sizes"][0])
    assert rows[0] == "| 5,000 x 10 | ipvsproxy | kube-proxy | kube-router |"
    cold = next(r for r in rows if r.startswith("| cold start |"))
    assert "11.00 s (10.00-12.00)" in cold
    rss = next(r for r in rows if r.startswith("| peak RSS: at cold start"))
    assert "| 95 MiB (90-100) / 100 MiB (95-105) |" in rss


def test_scaling_points_give_each_system_its_median_endpoint_change() -> None:
    (point,) = peers_report.scaling_points(data())
    assert point["services"] == 5000
    assert set(point) == {"services", "endpoints", "ipvsproxy", "kube-proxy", "kube-router"}


PROC_IP_VS = """IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port Forward Weight ActiveConn InActConn
TCP  0A600010:0050 rr
  -> 0AF40001:2774      Masq    1      0          0
  -> 0AF40002:2774      Masq    0      3          0
UDP  0A600011:0035 rr
"""


def test_proc_ip_vs_is_parsed_with_weights() -> None:
    table = kernel_view.parse_ip_vs(PROC_IP_VS)
    assert table == {
        ("TCP", "10.96.0.16", 80): {("10.244.0.1", 10100): 1, ("10.244.0.2", 10100): 0},
        ("UDP", "10.96.0.17", 53): {},
    }
    after = {**table, ("TCP", "10.96.0.16", 80): {("10.244.0.1", 10100): 1}}
    assert list(kernel_view.changed(table, after, set())) == [
        "~ ('TCP', '10.96.0.16', 80) ('10.244.0.2', 10100): 0 -> None"
    ]
    assert list(kernel_view.changed(table, after, {"10.96.0.16"})) == []


def test_a_failed_run_is_listed_and_left_out_of_the_figures() -> None:
    d = data()
    d["sizes"][0]["runs"]["kube-router"].append({"error": "TimeoutError: cold start"})
    text = "\n".join(peers_report.report(d))
    assert "- 5,000 x 10, kube-router run 3 failed: TimeoutError: cold start" in text
    assert peers_report.ratios(peers_report.completed(d["sizes"][0]), "kube-router")[3] == (
        pytest.approx(11 / 50)
    )


def test_change_cpu_leaves_out_the_windows_a_periodic_sync_fell_into() -> None:
    cpu = [0.0] * 12 + [0.01] * 6 + [7.0, 7.3]  # ticks of a few ms; two full syncs of 7 s
    runs = [{"changes": {"endpoint added": [[0.02, c] for c in cpu]}}]
    assert peers_report.change_cpu(runs, ["endpoint added"]) == pytest.approx(0.06 / 18)
    assert peers_report.cpu_outliers(runs, ["endpoint added"]) == (2, 20)
    # seconds per change (kube-proxy syncs everything on every change): a window that also
    # held a periodic sync (6.5 s: two syncs) is left out, the others' spread is kept
    heavy = [{"changes": {"endpoint added": [[3.0, c] for c in (2.0, 2.5, 3.0, 6.5)]}}]
    assert peers_report.change_cpu(heavy, ["endpoint added"]) == pytest.approx(2.5)


def test_the_size_table_says_how_many_changes_and_each_proxys_own_sync_time() -> None:
    size = data()["sizes"][0]
    fewer = run(90.0, 60.0, 100, 80)
    fewer["changes"] = {k: v[:2] for k, v in fewer["changes"].items()}  # a budget cut it short
    fewer["own_syncs"] = {"IPv4": {"count": 4, "sum": 200.0}, "IPv6": {"count": 1, "sum": 0.5}}
    again = {**fewer, "own_syncs": {"IPv4": {"count": 6, "sum": 300.0}}}
    size["runs"]["kube-proxy"] = [fewer, again]
    size["runs"]["ipvsproxy"][0]["own_syncs"] = {"": {"count": 2, "sum": 0.02}}
    rows = peers_report.size_table(size)
    counts = next(r for r in rows if r.startswith("| changes of each kind measured"))
    assert counts.endswith("| 40 | 4 | 40 |")
    own = next(r for r in rows if r.startswith("| its own sync duration"))
    assert own.endswith("| 10.0 ms (2) | 50,000 ms (10); 500 ms (1) IPv6 | - |")
    # ipvsproxy's one sync in both families' series: not shown twice
    both = {"count": 2, "sum": 0.02}
    size["runs"]["ipvsproxy"][0]["own_syncs"] = {"IPv4": both, "IPv6": dict(both)}
    own = next(r for r in peers_report.size_table(size) if r.startswith("| its own sync"))
    assert own.endswith("| 10.0 ms (2) | 50,000 ms (10); 500 ms (1) IPv6 | - |")


def test_a_run_of_some_kinds_reports_those_only() -> None:
    """A scaling run measures endpoints added and removed, no steady state nor restart: its
    report has rows for what it measured, "-" for a system without them, and no others."""
    d = data()
    for runs in d["sizes"][0]["runs"].values():
        for r in runs:
            r["changes"] = {k: r["changes"][k] for k in ("endpoint added", "endpoint removed")}
            del r["steady"], r["restart"]
    d["sizes"][0]["runs"]["kube-router"][0]["changes"]["endpoint removed"] = []
    d["sizes"][0]["runs"]["kube-router"][1]["changes"]["endpoint removed"] = []
    text = "\n".join(peers_report.report(d))
    assert "| endpoint added: latency median (p95) |" in text
    removed = next(line for line in text.splitlines() if line.startswith("| endpoint removed"))
    assert removed.endswith("| - |")
    assert "not ready" not in text and "Service added or deleted" not in text
    assert "| one endpoint change, proxy CPU" in text
