"""What dual-stack costs (``python -m bench.kernel --dual-stack SxE``, in the lab guest): the
synthetic cluster programmed three ways in one boot, alternating, each from a fresh node
namespace, then one endpoint change in each of two of them.

- ``ipv4``: its IPv4 Services, the proxy serving IPv4 only (a node without IPv6);
- ``ipv4-on-dual``: the same Services, the proxy serving both families, as on any node with
  IPv6 (its KUBE-6 sets, ip6tables chains and a second restore, and no IPv6 Service);
- ``dual-stack``: every Service dual-stack (``synthetic.dual_stack``: an IPv6 cluster IP,
  load-balancer VIP and slice beside the IPv4 ones), the proxy serving both: twice the virtual
  and real servers.

The ratios to ``ipv4`` are the figures to read (times in the guest are slow in absolute terms).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench import kernel
from ipvsproxy.core.plan import PlanConfig
from ipvsproxy.core.ruleset import RulesConfig
from lab.cluster import synthetic
from lab.net.node_dataplane import NodeDataplane

RULES = RulesConfig(cluster_cidr="10.244.0.0/16", cluster_cidr6="fd00:10:244::/48")
V4, BOTH = PlanConfig(), PlanConfig(families=(4, 6))
Entries = list[synthetic.ServiceEntry]


def _cases(v4: Entries) -> dict[str, tuple[Entries, PlanConfig]]:
    return {
        "ipv4": (v4, V4),
        "ipv4-on-dual": (v4, BOTH),
        "dual-stack": ([synthetic.dual_stack(e) for e in v4], BOTH),
    }


def _node(state: Path, plan: PlanConfig) -> NodeDataplane:
    return NodeDataplane(kernel.NODE, state, plan_config=plan, rules_config=RULES)


def _cold(cluster: Entries, plan: PlanConfig, workdir: Path) -> dict[str, Any]:
    kernel.wipe()
    n = _node(workdir / f"ds-{time.monotonic_ns()}.json", plan)
    try:
        start = time.perf_counter()
        result = n.run(kernel.program(cluster))
        seconds = time.perf_counter() - start
        reals = n.dp.desired.real_servers
        return {
            "seconds": seconds,
            "writes": result.writes,
            "virtual_servers": len(reals),
            "real_servers": sum(len(r) for r in reals.values()),
        }
    finally:
        n.close()


def _endpoint_change(
    cluster: Entries, plan: PlanConfig, dual: bool, workdir: Path, repeats: int
) -> dict[str, Any]:
    """One endpoint added to (then removed from) the middle Service, ``repeats`` times each
    way: the median time, the most writes, and the median forced full resync (which must
    write nothing)."""
    key, svc, slices = cluster[len(cluster) // 2]
    v4 = [sl for sl in slices if sl.get("addressType") == "IPv4"]
    shape: Callable[[Any], Any] = synthetic.dual_stack if dual else (lambda e: e)
    added = shape((key, svc, synthetic.with_endpoint_added(v4)))
    current: dict[str, tuple[dict[str, Any] | None, list[dict[str, Any]]]] = {
        k: (s, sl) for k, s, sl in cluster
    }
    times: list[float] = []
    writes: list[int] = []
    full: list[float] = []
    kernel.wipe()
    n = _node(workdir / "ds-change.json", plan)
    try:
        n.run(kernel.program(cluster))
        for _ in range(repeats):
            for event in (added, (key, svc, slices)):
                seconds, w = kernel.timed(partial(n.run, kernel.one_event(event)))
                times.append(seconds)
                writes.append(w)
                current[key] = (event[1], event[2])
                full_s, full_w = kernel.timed(partial(n.run, kernel.full_resync(current)))
                if full_w:
                    raise RuntimeError(f"a full resync still wrote {full_w} times")
                full.append(full_s)
    finally:
        n.close()
    return {
        "seconds": statistics.median(times),
        "writes": max(writes),
        "full_resync_s": statistics.median(full),
    }


def measure(
    services: int, endpoints: int, workdir: Path, pairs: int = 3, repeats: int = 3
) -> dict[str, Any]:
    """Cold syncs of the three cases in ``pairs`` alternating rounds, then the endpoint change
    in ``ipv4`` and ``dual-stack``; each case's medians and their ratios to ``ipv4``."""
    cases = _cases(synthetic.cluster(services, endpoints))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in cases}
    for i in range(pairs):
        for name, (cluster, plan) in cases.items():
            runs[name].append(_cold(cluster, plan, workdir))
            kernel.progress(f"dual-stack round {i + 1}, {name}: {runs[name][-1]['seconds']:.2f} s")
    out: dict[str, Any] = {"services": services, "endpoints": endpoints, "pairs": pairs}
    for name, rows in runs.items():
        out[name] = {
            "cold_s": statistics.median(r["seconds"] for r in rows),
            "cold_runs_s": [r["seconds"] for r in rows],
            "writes": rows[-1]["writes"],
            "virtual_servers": rows[-1]["virtual_servers"],
            "real_servers": rows[-1]["real_servers"],
        }
    for name in ("ipv4", "dual-stack"):
        cluster, plan = cases[name]
        change = _endpoint_change(cluster, plan, name == "dual-stack", workdir, repeats)
        out[name]["change"] = change
        kernel.progress(
            f"dual-stack {name}: endpoint change {change['seconds'] * 1e3:.1f} ms, "
            f"{change['writes']} writes; full resync {change['full_resync_s']:.2f} s"
        )
    base = out["ipv4"]
    for name in ("ipv4-on-dual", "dual-stack"):
        out[name]["cold_ratio"] = out[name]["cold_s"] / base["cold_s"]
    ds = out["dual-stack"]
    ds["change_ratio"] = ds["change"]["seconds"] / base["change"]["seconds"]
    ds["full_resync_ratio"] = ds["change"]["full_resync_s"] / base["change"]["full_resync_s"]
    kernel.wipe()
    return out


def rows(d: dict[str, Any]) -> list[str]:
    """The report's table."""
    size = f"{d['services']:,} x {d['endpoints']}"
    out = [
        f"| {size} (median of {d['pairs']}) | virtual / real servers | cold sync | ratio | "
        "netlink writes | endpoint change (writes) | forced full resync |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in ("ipv4", "ipv4-on-dual", "dual-stack"):
        c = d[name]
        change = c.get("change")
        ch = f"{change['seconds'] * 1e3:.1f} ms ({change['writes']})" if change else "-"
        full = f"{change['full_resync_s']:.2f} s" if change else "-"
        out.append(
            f"| {name} | {c['virtual_servers']:,} / {c['real_servers']:,} | {c['cold_s']:.2f} s "
            f"| {c.get('cold_ratio', 1.0):.2f} | {c['writes']:,} | {ch} | {full} |"
        )
    return out
