"""``make bench``'s side-by-side run (``bench/peers.py``) at a smoke size with all three systems,
so that CI proves it still runs: ipvsproxy, upstream kube-proxy (IPVS mode) and kube-router
each programmed from the real API server, every kind of change seen in the kernel, a restart
measured. No timing asserts (speeds go in ``make bench``); what is asserted of ipvsproxy is
behaviour: its restart over an unchanged kernel writes nothing and keeps the connection."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench import peers, peers_report

REPO = Path(__file__).resolve().parents[2]
SERVICES, ENDPOINTS = 12, 2


def test_the_side_by_side_benchmark_runs_at_a_smoke_size(tmp_path: Path) -> None:
    """In a guest of its own, as ``make bench`` runs it (the kernel tests' guest holds a lab
    topology of its own on the same underlay)."""
    out = tmp_path / "peers.json"
    argv = [sys.executable, "-m", "lab", "run", "--timeout", "1500", "--mem", "3G", "--"]
    argv += ["python", "-m", "bench.peers", f"--sizes={SERVICES}x{ENDPOINTS}", "--runs=1"]
    argv += ["--changes=1", "--steady=2", "--settle=0", f"--workdir={tmp_path / 'work'}"]
    argv += [f"--output={out}"]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0 and out.exists(), (proc.stdout + proc.stderr)[-6000:]
    data = json.loads(out.read_text())
    (size,) = data["sizes"]
    assert set(size["runs"]) == set(peers.SYSTEMS)
    for system, (run,) in size["runs"].items():
        # every Service's cluster-IP virtual servers at least, and the conn Service
        assert run["virtual_servers"] > SERVICES, system
        assert run["cold_s"] > 0 and run["peak_rss_mib"] > 0, system
        assert set(run["changes"]) == set(peers_report.KINDS), system
        assert all(c[0] > 0 for cs in run["changes"].values() for c in cs), system
        assert run["restart"]["converge_s"] > 0, system
        assert set(run["steady"]) == {"idle_cpu_s_per_min", "busy_cpu_s_per_min"}, system
    for system in ("ipvsproxy", "kube-proxy"):  # their own metrics: first sync, sync time
        (run,) = size["runs"][system]
        assert run["first_sync_s"] >= run["cold_s"], system
        assert run["own_syncs"]["IPv4"]["count"] > 0, system
    ours = size["runs"]["ipvsproxy"][0]["restart"]
    assert ours["own_writes"] == 0
    assert ours["ipvs_changed"] == 0
    assert ours["connection"] == "survived"
    text = "\n".join(peers_report.report(data))
    assert "| 1 | one endpoint change, latency (median)" in text
