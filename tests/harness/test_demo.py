"""`make demo` (python -m lab demo): it boots the lab, shows ipvsproxy at work and fails when the
dataplane does not behave. Each test boots a guest (about a minute)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_demo(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lab", "demo", *extra],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )


def rows(out: str, source: str, target: str) -> list[str]:
    """Lines of the traffic table from ``source`` to ``target``."""
    return [
        line
        for line in out.splitlines()
        if re.match(rf"{re.escape(source)}\s+{re.escape(target)}\s", line)
    ]


def test_the_demo_shows_ipvsproxy_at_work() -> None:
    proc = run_demo()
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    # Progress: each long step announced, and timed when it ends.
    for step in (
        "==> Booting the lab kernel",
        "==> Starting the real control plane",
        "==> Registering the 6 Pods of app.yaml",
        "==> Starting ipvsproxy run on node-1, node-2, node-3",
        "==> Waiting for the first sync of ipvsproxy on every node",
        "==> Sending traffic",
        "==> ip netns exec node-1 python -m ipvsproxy status --state-file ",
    ):
        assert step in out, step
    assert re.search(r"^    ok \(\d+\.\d s\)$", out, re.M)
    for node in ("node-1", "node-2", "node-3"):
        assert re.search(rf"^    {node}: synced after \d+\.\d s$", out, re.M), node
    # The Services and their endpoints, from the controller's slices.
    assert re.search(
        r"^web\s+ClusterIP\s+10\.96\.\S+\s+-\s+80/TCP,53/UDP\s+pod-1-1,pod-2-1,pod-3-1", out, re.M
    )
    assert re.search(r"^local\s+LoadBalancer\s+\S+\s+203\.0\.113\.11\s+.*pod-2-2", out, re.M)
    # The traffic table.
    assert re.search(
        r"^FROM\s+TO\s+SERVICE\s+PROTO\s+ANSWERED BY\s+CLIENT SEEN\s+CHECK$", out, re.M
    )
    (web_tcp,) = rows(out, "pod on node-1", "10.96.0.10:80")
    assert "10.244.1.12" in web_tcp and "ok: pod address kept" in web_tcp
    (web_udp,) = rows(out, "pod on node-3", "10.96.0.10:53")
    assert " udp " in web_udp and "ok: pod address kept" in web_udp
    for ip in ("192.168.56.11", "192.168.56.12", "192.168.56.13"):  # NodePort on every node
        assert any("ok: masqueraded (SNAT)" in r for r in rows(out, "external", f"{ip}:30080")), ip
    (lb,) = rows(out, "external", "203.0.113.10:80")
    assert "ok: masqueraded (SNAT)" in lb
    for target in ("192.168.56.12:30090", "203.0.113.11:80"):  # eTP Local keeps the client
        (local,) = rows(out, "external", target)
        assert "pod-2-2" in local and "192.168.56.100" in local
        assert "ok: client address preserved" in local
    (elsewhere,) = rows(out, "external", "192.168.56.11:30090")
    assert "ok: not forwarded, as expected" in elsewhere
    (sticky,) = rows(out, "external", "192.168.56.11:30081")
    assert re.search(r"pod-\d-1 \(6/6\)", sticky) and "ok: all 6 to one pod (affinity)" in sticky
    assert "ok: health check: 200, localEndpoints=1" in out
    assert "ok: health check: 503, localEndpoints=0" in out
    assert "FAIL" not in out
    # ipvsproxy status of node-1 names the Services it programmed.
    status = out.split("python -m ipvsproxy status", 1)[1]
    assert "default/web" in status and "10.96.0.10" in status
    assert "demo: every check held (16 traffic checks" in out


def test_a_broken_dataplane_fails_the_demo_and_says_what_did_not_behave() -> None:
    proc = run_demo("--inject-fault", "drop-real-servers")
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "FAULT INJECTED (drop-real-servers)" in out
    assert "demo: FAILED" in out
    summary = out.split("demo: FAILED", 1)[1]
    assert "pod on node-1 -> 10.96.0.10:80 (web, tcp): no answer" in summary
    assert "external -> 192.168.56.12:30090 (local, tcp): no answer" in summary
    assert "demo: every check held" not in out
