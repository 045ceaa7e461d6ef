"""Kernel benchmarks, inside the lab guest: ``python -m lab run -- python -m bench.kernel``.

One node namespace (``bench-node``: lo, a dummy eth0 with the node address) holds everything.
Each figure compares two runs made in this one guest boot, alternating, so the slow and noisy
User-Mode Linux kernel cancels out of the ratios:

- cold sync: ipvsproxy's Dataplane from an empty kernel to fully programmed (planning included)
  against the C tools loading the same final state (``ipvsadm -R``, ``ipset restore``,
  ``iptables-restore``, ``ip -batch``), the state taken from what ipvsproxy programmed;
- one change at scale: one endpoint added, removed, flipped not-ready, one Service added and
  one deleted, each as ``update_service`` + ``sync`` (what the daemon's sync runner does for one
  event), against a forced full resync of the same state (every Service re-planned, the kernel
  read back and diffed, as upstream does on every sync); netlink write operations counted;
- restart adoption: a new Dataplane over the programmed kernel, its first sync's time and
  writes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from bench import memory
from ipvsproxy.dataplane.dataplane import Dataplane, SyncResult
from lab.cluster import synthetic
from lab.net.node_dataplane import NodeDataplane
from lab.net.topology import Node

NS = "bench-node"
NODE_IP = "192.168.56.11"
NODE_IP6 = "fc00:f853:ccd:e793::b"  # the lab's underlay, as node-1's (bench.dual_stack)
Cluster = list[tuple[str, dict[str, Any], list[dict[str, Any]]]]


def sh(script: str, check: bool = True) -> str:
    """A shell script in the node namespace."""
    proc = subprocess.run(
        ["ip", "netns", "exec", NS, "sh", "-c", script], capture_output=True, text=True
    )
    if check and proc.returncode != 0:
        raise RuntimeError(f"{script!r} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def make_node() -> None:
    subprocess.run(["ip", "netns", "del", NS], capture_output=True)
    time.sleep(2)  # let the kernel tear the old namespace's tables down before timing anything
    subprocess.run(["ip", "netns", "add", NS], check=True)
    sh(
        "ip link set lo up && ip link add eth0 type dummy && "
        f"ip addr add {NODE_IP}/24 dev eth0 && ip addr add {NODE_IP6}/64 dev eth0 nodad && "
        "ip link set eth0 up && sysctl -qw net.ipv6.conf.all.forwarding=1"
    )


def wipe() -> None:
    """Back to an empty kernel: a fresh node namespace.

    Clearing the tables in place is not enough: IPVS keeps every deleted real server in its
    namespace's trash list for one to two minutes and searches that list linearly on every real
    server it adds, so a load right after clearing 50,000 real servers was up to 8 times slower
    (ipvsproxy at 5,000 x 10: 22 s after a small wipe, 190 s after a large one).
    """
    make_node()


# The node as the lab topology describes one: the kernel tests' NodeDataplane runs on it.
NODE = Node(
    name="node-1",
    index=1,
    netns=NS,
    ip=NODE_IP,
    pod_cidr="10.244.1.0/24",
    gateway=NODE_IP,
    ip6=NODE_IP6,
    pods=(),
)


@contextmanager
def node(state: Path) -> Iterator[NodeDataplane]:
    n = NodeDataplane(NODE, state)
    try:
        yield n
    finally:
        n.close()


def checked(result: SyncResult) -> SyncResult:
    if result.errors:
        raise RuntimeError(f"sync failed: {result.errors[:3]}")
    return result


def load_all(dp: Dataplane, cluster: Cluster) -> None:
    for key, svc, slices in cluster:
        error = dp.update_service(key, svc, slices)
        if error:
            raise RuntimeError(f"{key}: {error}")


def program(cluster: Cluster) -> Callable[[Dataplane], SyncResult]:
    """Every Service handed to the dataplane, then one sync (the first is a full one)."""

    def run(dp: Dataplane) -> SyncResult:
        load_all(dp, cluster)
        return checked(dp.sync())

    return run


# -- cold sync ----------------------------------------------------------------------------------


def ipvsproxy_cold(cluster: Cluster, workdir: Path) -> tuple[float, int]:
    state = workdir / f"state-{time.monotonic_ns()}.json"
    with node(state) as n:
        start = time.perf_counter()
        result = n.run(program(cluster))
        return time.perf_counter() - start, result.writes


def snapshot() -> dict[str, str]:
    """What ipvsproxy programmed, as inputs for the C tools' restore commands."""
    addrs = sh("ip -o -4 addr show dev kube-ipvs0").split()
    batch = "link add kube-ipvs0 type dummy\n" + "".join(
        f"addr add {addrs[i + 1]} dev kube-ipvs0\n" for i, w in enumerate(addrs) if w == "inet"
    )
    return {
        "ipvsadm": sh("ipvsadm -Sn"),
        "ipset": sh("ipset save"),
        "iptables": sh("iptables-save"),
        "ip": batch,
    }


def c_tools_cold(snap: dict[str, str], workdir: Path) -> float:
    for name, text in snap.items():
        (workdir / f"{name}.txt").write_text(text)
    script = (
        f"ip -batch {workdir}/ip.txt && ipset restore < {workdir}/ipset.txt && "
        f"iptables-restore < {workdir}/iptables.txt && ipvsadm -R < {workdir}/ipvsadm.txt"
    )
    start = time.perf_counter()
    sh(script)
    return time.perf_counter() - start


def _normal(text: str) -> list[str]:
    """Lines without iptables-save's dated comments and chain counters, in order."""
    return sorted(
        re.sub(r" \[\d+:\d+\]$", "", line) for line in text.splitlines() if not line.startswith("#")
    )


def same_state(snap: dict[str, str]) -> list[str]:
    """The parts of the kernel state that differ from ``snap`` (none: the same)."""
    now = snapshot()
    return [k for k in snap if _normal(now[k]) != _normal(snap[k])]


def cold_sync(services: int, endpoints: int, pairs: int, workdir: Path) -> dict[str, Any]:
    cluster = synthetic.cluster(services, endpoints)
    rows: list[dict[str, float]] = []
    for i in range(pairs):
        wipe()
        ours, writes = ipvsproxy_cold(cluster, workdir)
        snap = snapshot()
        wipe()
        theirs = c_tools_cold(snap, workdir)
        differ = same_state(snap)
        if differ:
            raise RuntimeError(f"the C tools did not load what ipvsproxy programmed: {differ}")
        rows.append({"ipvsproxy_s": ours, "c_tools_s": theirs, "ratio": ours / theirs})
        progress(f"cold {services}x{endpoints} pair {i + 1}: {ours:.2f} s vs {theirs:.2f} s")
    wipe()
    real_servers = sum(len(rs) for rs in _real_servers(cluster, workdir))
    return {
        "services": services,
        "endpoints": endpoints,
        "virtual_servers": snap["ipvsadm"].count("-A "),
        "real_servers": real_servers,
        "writes": writes,
        "pairs": rows,
        "ipvsproxy_s": statistics.median(r["ipvsproxy_s"] for r in rows),
        "c_tools_s": statistics.median(r["c_tools_s"] for r in rows),
        "ratio": statistics.median(r["ratio"] for r in rows),
    }


def _real_servers(cluster: Cluster, workdir: Path) -> list[Any]:
    with node(workdir / "count.json") as n:
        n.run(lambda dp: load_all(dp, cluster))
        return list(n.dp.desired.real_servers.values())


# -- one change at scale, forced full resync, restart ------------------------------------------


def sends(n: NodeDataplane) -> int:
    """System calls that carried netlink requests, so far."""
    b = n.backends
    return b.ipvs.sock.sends + b.addresses.sock.sends + b.ipsets.sock.sends


def timed(fn: Callable[[], SyncResult]) -> tuple[float, int]:
    """Seconds and netlink write operations of one sync."""
    start = time.perf_counter()
    result = checked(fn())
    return time.perf_counter() - start, result.writes


Event = tuple[str, dict[str, Any] | None, list[dict[str, Any]]]


def changes(cluster: Cluster) -> list[tuple[str, Event]]:
    """One event each, applied in this order: (what, (service key, Service or None, slices))."""
    key, svc, slices = cluster[len(cluster) // 2]
    new_key, new_svc, new_slices = synthetic.new_service(cluster)
    return [
        ("endpoint added", (key, svc, synthetic.with_endpoint_added(slices))),
        ("endpoint removed", (key, svc, slices)),
        ("endpoint not ready", (key, svc, synthetic.with_endpoint_not_ready(slices))),
        ("endpoint ready again", (key, svc, slices)),
        ("service added", (new_key, new_svc, new_slices)),
        ("service deleted", (new_key, None, [])),
    ]


def one_event(event: Event) -> Callable[[Dataplane], SyncResult]:
    """What the sync runner does for one event: re-plan that Service, apply what changed."""
    key, svc, slices = event

    def run(dp: Dataplane) -> SyncResult:
        dp.update_service(key, svc, slices)
        return dp.sync()

    return run


def full_resync(
    current: dict[str, tuple[dict[str, Any] | None, list[dict[str, Any]]]],
) -> Callable[[Dataplane], SyncResult]:
    """Upstream's way, for comparison: re-plan every Service, read the kernel back, diff all."""

    def run(dp: Dataplane) -> SyncResult:
        for key, (svc, slices) in current.items():
            dp.update_service(key, svc, slices)
        return dp.reconcile()

    return run


def at_scale(services: int, endpoints: int, workdir: Path, rounds: int = 3) -> dict[str, Any]:
    """The six changes, ``rounds`` times over (each round ends where it began): per change the
    median time, the most writes, and the median forced full resync of the state after it."""
    cluster = synthetic.cluster(services, endpoints)
    current: dict[str, tuple[dict[str, Any] | None, list[dict[str, Any]]]] = {
        key: (svc, slices) for key, svc, slices in cluster
    }
    wipe()
    state = workdir / "scale.json"
    out: dict[str, Any] = {"services": services, "endpoints": endpoints, "rounds": rounds}
    seen: dict[str, list[tuple[float, int, int, float]]] = {}
    with node(state) as n:
        n.run(program(cluster))
        for _ in range(rounds):
            for what, event in changes(cluster):
                before = sends(n)
                seconds, writes = timed(partial(n.run, one_event(event)))
                calls = sends(n) - before
                current[event[0]] = (event[1], event[2])
                # The same state once more, the full way: it must find nothing left to write.
                full_s, full_w = timed(partial(n.run, full_resync(current)))
                if full_w:
                    raise RuntimeError(f"after {what}, a full resync still wrote {full_w} times")
                seen.setdefault(what, []).append((seconds, writes, calls, full_s))
                progress(
                    f"{what}: {seconds * 1e3:.1f} ms, {writes} writes in {calls} system calls;"
                    f" full {full_s:.2f} s"
                )
        out["changes"] = [
            {
                "change": what,
                "seconds": statistics.median(r[0] for r in runs),
                "writes": max(r[1] for r in runs),
                "sends": max(r[2] for r in runs),
                "full_resync_s": statistics.median(r[3] for r in runs),
                "runs": len(runs),
            }
            for what, runs in seen.items()
        ]
        out["full_resync_s"] = statistics.median(c["full_resync_s"] for c in out["changes"])
    # Restart: a new process's Dataplane over the programmed kernel, same state file.
    final = [(k, s, sl) for k, (s, sl) in current.items() if s is not None]
    with node(state) as n:
        start = time.perf_counter()
        result = n.run(program(final))
        out["restart"] = {"seconds": time.perf_counter() - start, "writes": result.writes}
        progress(f"restart: {out['restart']['seconds']:.2f} s, {result.writes} writes")
    wipe()
    return out


# -- scaling: one endpoint change against the size of the cluster ------------------------------


def scaling_point(
    services: int, endpoints: int, workdir: Path, repeats: int = 3, c_repeats: int = 1
) -> dict[str, Any]:
    """At one size: one endpoint change incrementally and as a forced full resync (the
    median of ``repeats`` changes each way), and the C tools loading the whole state (what a
    design that reloads everything does per change; ``c_repeats`` loads, the slowest part)."""
    cluster = synthetic.cluster(services, endpoints)
    key, svc, slices = cluster[len(cluster) // 2]
    current: dict[str, tuple[dict[str, Any] | None, list[dict[str, Any]]]] = {
        k: (sv, sl) for k, sv, sl in cluster
    }
    wipe()
    incremental: list[float] = []
    full: list[float] = []
    with node(workdir / f"scaling-{services}.json") as n:
        n.run(program(cluster))
        for _ in range(repeats):
            for changed in (synthetic.with_endpoint_added(slices), slices):
                seconds, _ = timed(partial(n.run, one_event((key, svc, changed))))
                incremental.append(seconds)
                current[key] = (svc, changed)
                full_s, full_w = timed(partial(n.run, full_resync(current)))
                if full_w:
                    raise RuntimeError(f"a full resync at {services} still wrote {full_w} times")
                full.append(full_s)
    snap = snapshot()
    c_tools: list[float] = []
    for _ in range(c_repeats):
        wipe()
        c_tools.append(c_tools_cold(snap, workdir))
    wipe()
    point = {
        "services": services,
        "endpoints": endpoints,
        "incremental_s": statistics.median(incremental),
        "full_resync_s": statistics.median(full),
        "c_tools_reload_s": statistics.median(c_tools),
    }
    progress(
        f"scaling {services}x{endpoints}: one change {point['incremental_s'] * 1e3:.1f} ms, "
        f"full resync {point['full_resync_s']:.2f} s, C tools {point['c_tools_reload_s']:.1f} s"
    )
    return point


def profile(size: str, workdir: Path) -> int:
    import cProfile
    import pstats

    s, e = (int(x) for x in size.split("x"))
    cluster = synthetic.cluster(s, e)
    wipe()
    prof = cProfile.Profile()
    prof.enable()
    seconds, writes = ipvsproxy_cold(cluster, workdir)
    prof.disable()
    print(f"cold sync {size}: {seconds:.2f} s, {writes} writes")
    stats = pstats.Stats(prof, stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(45)
    stats.sort_stats("tottime").print_stats(25)
    wipe()
    return 0


def progress(text: str) -> None:
    print(f"    {text}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.kernel")
    p.add_argument("--sizes", default="1000x10,5000x10", help="cold-sync sizes, SxE,...")
    p.add_argument("--scale", default="5000x10", help="size for one change and restart")
    p.add_argument("--pairs", type=int, default=3, help="alternating pairs per cold size")
    p.add_argument(
        "--memory", default="5000x10,10000x10", help="peak RSS of ipvsproxy run at SxE,..."
    )
    p.add_argument("--output", type=Path, help="write the results as JSON here")
    p.add_argument(
        "--profile", metavar="SxE", help="only profile one ipvsproxy cold sync of this size"
    )
    p.add_argument("--scaling", metavar="SxE,...", help="only the scaling run, at these sizes")
    p.add_argument(
        "--dual-stack", default="5000x10", metavar="SxE", help="dual-stack's cost ('': none)"
    )
    p.add_argument("--dual-stack-only", action="store_true", help="only dual-stack's cost")
    args = p.parse_args(argv)
    if not os.environ.get("LAB_IN_GUEST"):
        print("bench.kernel runs inside the lab guest: python -m lab run -- ...", file=sys.stderr)
        return 2
    make_node()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.profile:
            return profile(args.profile, work)
        if args.scaling:
            points = []
            for size in args.scaling.split(","):
                s, e = (int(x) for x in size.split("x"))
                points.append(scaling_point(s, e, work))
            return _write({"scaling": points}, args.output)
        if args.dual_stack_only:
            return _write({"dual_stack": dual_stack_cost(args.dual_stack, work)}, args.output)
        results: dict[str, Any] = {"cold": [], "scale": None}
        for size in filter(None, args.sizes.split(",")):
            s, e = (int(x) for x in size.split("x"))
            results["cold"].append(cold_sync(s, e, args.pairs, work))
        s, e = (int(x) for x in args.scale.split("x"))
        results["scale"] = at_scale(s, e, work)
        results["memory"] = []
        for size in filter(None, args.memory.split(",")):
            s, e = (int(x) for x in size.split("x"))
            wipe()
            m = memory.peak_rss(s, e, NS, NODE.name, NODE_IP, work)
            progress(
                f"memory {size}: peak RSS {m['peak_rss_mib']:.0f} MiB, first sync "
                f"{m['first_sync_s']:.1f} s"
            )
            results["memory"].append(m)
        if args.dual_stack:
            results["dual_stack"] = dual_stack_cost(args.dual_stack, work)
        wipe()
    return _write(results, args.output)


def dual_stack_cost(size: str, workdir: Path) -> dict[str, Any]:
    from bench import dual_stack  # (it imports this module)

    s, e = (int(x) for x in size.split("x"))
    return dual_stack.measure(s, e, workdir)


def _write(results: dict[str, Any], output: Path | None) -> int:
    text = json.dumps(results, indent=2)
    if output:
        output.write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
