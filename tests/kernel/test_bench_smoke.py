"""``make bench``'s kernel part at a smoke size, so that CI proves it still runs (no timing
asserts: speeds go in ``make bench``). What it checks is what the benchmark relies on: the C
tools load exactly what ipvsproxy programmed, a full resync after each change writes nothing,
one endpoint change is a handful of writes, a restart writes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import dual_stack, kernel, memory

pytestmark = pytest.mark.kernel


def test_the_kernel_benchmark_runs_at_a_smoke_size(tmp_path: Path) -> None:
    kernel.make_node()
    cold = kernel.cold_sync(30, 3, pairs=1, workdir=tmp_path)
    assert cold["virtual_servers"] > 30 and cold["real_servers"] >= 3 * cold["virtual_servers"]
    assert cold["writes"] > cold["real_servers"]
    (pair,) = cold["pairs"]
    assert pair["ipvsproxy_s"] > 0 and pair["c_tools_s"] > 0
    scale = kernel.at_scale(30, 3, tmp_path, rounds=2)
    by_change = {c["change"]: c for c in scale["changes"]}
    assert set(by_change) == {
        "endpoint added",
        "endpoint removed",
        "endpoint not ready",
        "endpoint ready again",
        "service added",
        "service deleted",
    }
    for name, change in by_change.items():
        assert change["writes"] >= 1, name  # every event changed the kernel
        if name.startswith("endpoint"):
            assert change["writes"] <= 7, name  # one write per virtual server at most
    assert scale["restart"]["writes"] == 0
    kernel.wipe()
    assert kernel.sh("ipvsadm -Sn") == ""


def test_the_memory_benchmark_runs_at_a_smoke_size(tmp_path: Path) -> None:
    """``ipvsproxy run`` lists the cluster from the in-process API server over HTTP, programs
    it (every virtual server of it is in the kernel) and its peak RSS is read."""
    kernel.make_node()
    planned = kernel.cold_sync(20, 2, pairs=1, workdir=tmp_path)["virtual_servers"]
    kernel.wipe()
    m = memory.peak_rss(20, 2, kernel.NS, kernel.NODE.name, kernel.NODE_IP, tmp_path)
    assert m["services"] == 20
    assert m["virtual_servers"] == planned  # what the daemon had programmed at its first sync
    assert 10 < m["peak_rss_mib_first_sync"] <= m["peak_rss_mib"]
    assert m["first_sync_s"] > 0
    kernel.wipe()


def test_the_dual_stack_benchmark_runs_at_a_smoke_size(tmp_path: Path) -> None:
    """Dual-stack Services program twice the virtual and real servers of their IPv4 halves
    (``measure`` also checks that a full resync after each change writes nothing); serving
    IPv6 without IPv6 Services changes no virtual server."""
    kernel.make_node()
    d = dual_stack.measure(20, 2, tmp_path, pairs=1, repeats=1)
    v4, on_dual, ds = d["ipv4"], d["ipv4-on-dual"], d["dual-stack"]
    assert v4["virtual_servers"] == on_dual["virtual_servers"] > 20
    assert ds["virtual_servers"] == 2 * v4["virtual_servers"]
    assert ds["real_servers"] == 2 * v4["real_servers"]
    assert on_dual["writes"] > v4["writes"]  # the KUBE-6 sets and IPv6 rules
    assert v4["change"]["writes"] >= 1 and ds["change"]["writes"] == 2 * v4["change"]["writes"]
    assert len(dual_stack.rows(d)) == 5
    assert kernel.sh("ipvsadm -Sn") == ""
