"""Host-side benchmarks (no kernel): what a sync costs in Python before any system call.

``python -m bench.host [--services N] [--endpoints E] [--json]``

The real ``Dataplane`` runs its real ``sync()`` with the real IPVS, ipset and address backends
over the fake kernel (``ipvsproxy.kernel.fakes.codec``): every request is encoded by the
backends as for the kernel, counted, and answered by the fakes' tables, which hold what was
written (a real server read back to drain is one of them); the time the fakes take to answer is
the kernel's work and is not counted. The iptables rules are rendered and restored into the
fake, and the state file is written to a temporary folder. The garbage collector is handled as
the daemon handles it (``ipvsproxy/process/gc_tuning.py``).

1. Cold sync of the synthetic cluster (``lab.cluster.synthetic``), as the daemon's first sync does
   it: every Service planned (``update_service``), then the first ``sync()`` (a reconcile of
   an empty kernel: diff everything, encode every message, record, render the rules, save the
   state file), then the collector's one pass after a full sync. Median of 3 runs. Figures:
   the planner (plan + diff) in total and per Service; and the host CPU per real server of all
   of it (the issue's "planning + diffing + encoding", and the bookkeeping a sync does too).
2. One change in that cluster, as ``update_service`` + an incremental ``sync()``: one endpoint
   added, removed, flipped not ready, and one Service added and deleted, in the Service with
   the most virtual servers. Median of 101 runs each; each timed change is undone (untimed)
   before the next.
3. One endpoint added to a Service of 500 to 4,000 ports (``measure_wide``): the planner's time
   per port and endpoint, flat when planning is linear in ports x endpoints.

Times are wall-clock (``time.perf_counter``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ipvsproxy.core import ipset_specs, ruleset
from ipvsproxy.core.diff import AddressOp, DestOp, MemberOp, ServiceOp
from ipvsproxy.core.plan import NodeFacts
from ipvsproxy.dataplane.dataplane import Dataplane, SyncResult
from ipvsproxy.dataplane.statefile import State, StateFile
from ipvsproxy.kernel.addresses import DUMMY_DEVICE
from ipvsproxy.kernel.fakes import FakeAddresses, FakeConntrack, FakeIPSets, FakeIPTables, wire
from ipvsproxy.kernel.fakes.codec import (
    CodecAddresses,
    CodecBackends,
    CodecIPSets,
    CodecIPVS,
    FakeChannel,
)
from ipvsproxy.kernel.fakes.sysctls import FRESH_NODE, FakeSysctls
from ipvsproxy.kernel.netlink.sock import Outcome
from ipvsproxy.kernel.sysctl import required
from ipvsproxy.process import gc_tuning
from lab.cluster import synthetic

NODE_IP = "192.168.56.11"
NODE = NodeFacts(
    name="node-1",
    node_ips=(NODE_IP,),
    local_addresses=frozenset({NODE_IP}),
    primary_ip=NODE_IP,
)
RULES = ruleset.RulesConfig(cluster_cidr="10.244.0.0/16")
COLD_RUNS = 5
CHANGE_RUNS = 101
CHANGE_TARGET_US = 1000.0
PER_REAL_SERVER_TARGET_US = 10.0
# plan: update_service; encode: the backends' apply (encode, outcomes, counters; not the fake
# kernel's answers); save: the state file; sync: the rest of sync() (read back, diff, record,
# rules); gc: the collector's pass after a full sync.
PHASES = ("plan", "sync", "encode", "save", "gc")


class HostChannel(FakeChannel):
    """The fake kernel's channel, its answering timed apart (``seconds["kernel"]``): that is
    the kernel's work, not ipvsproxy's."""

    def __init__(self, seconds: dict[str, float]) -> None:
        super().__init__()
        self.seconds = seconds

    def execute(self, requests: Sequence[tuple[int, bytes]]) -> list[Outcome]:
        self.count(requests)
        answer = self.answer
        start = time.perf_counter()
        errnos = [answer(i) for i in range(len(requests))]
        self.seconds["kernel"] += time.perf_counter() - start
        return [Outcome(seq, e) for (seq, _), e in zip(requests, errnos, strict=True)]


def _timed(seconds: dict[str, float], phase: str, start: float) -> None:
    seconds[phase] += time.perf_counter() - start


class HostIPVS(CodecIPVS):
    """Its apply timed as the "encode" phase."""

    def __init__(self, channel: HostChannel) -> None:
        super().__init__(channel=channel)
        self.seconds = channel.seconds

    def apply(self, ops: Sequence[ServiceOp | DestOp]) -> int:
        start = time.perf_counter()
        try:
            return super().apply(ops)
        finally:
            _timed(self.seconds, "encode", start)


class HostIPSets(CodecIPSets):
    """Its apply timed as the "encode" phase."""

    def __init__(self, fake: FakeIPSets, channel: HostChannel) -> None:
        super().__init__(fake, channel)
        self.seconds = channel.seconds

    def apply(self, ops: Sequence[MemberOp]) -> int:
        start = time.perf_counter()
        try:
            return super().apply(ops)
        finally:
            _timed(self.seconds, "encode", start)


class HostAddresses(CodecAddresses):
    """Its apply timed as the "encode" phase."""

    def __init__(self, fake: FakeAddresses, channel: HostChannel) -> None:
        super().__init__(fake, channel)
        self.seconds = channel.seconds

    def apply(self, ops: Sequence[AddressOp]) -> int:
        start = time.perf_counter()
        try:
            return super().apply(ops)
        finally:
            _timed(self.seconds, "encode", start)


class HostStateFile(StateFile):
    """Its save timed as the "save" phase."""

    def __init__(self, path: Path, seconds: dict[str, float]) -> None:
        super().__init__(path)
        self.seconds = seconds

    def save(self, state: State) -> bool:
        start = time.perf_counter()
        try:
            return super().save(state)
        finally:
            _timed(self.seconds, "save", start)


@dataclass
class Host:
    """A Dataplane over the fake kernel behind the real codec, with its phase clock."""

    dp: Dataplane
    kernel: CodecBackends
    channels: dict[str, HostChannel]
    seconds: dict[str, float]

    def messages(self) -> dict[str, int]:
        return {name: c.requests for name, c in self.channels.items()}

    def bytes(self) -> int:
        return sum(c.bytes for c in self.channels.values())

    def reads(self) -> int:
        """Virtual servers whose real servers were read back (to drain)."""
        return self.kernel.ipvs.fake.calls["dests"]

    def close(self) -> None:
        self.kernel.close()


def new_host(state_dir: Path) -> Host:
    """A node already running: kube-ipvs0 and every set exist, the sysctls are set (their
    creation is not the hot path)."""
    seconds = dict.fromkeys((*PHASES, "kernel"), 0.0)
    channels = {name: HostChannel(seconds) for name in ("ipvs", "addresses", "ipsets")}
    ipsets, iptables = FakeIPSets(), FakeIPTables()
    wire(ipsets, iptables)
    for name in ipset_specs.NAMES:
        ipsets.add_set(name)
    addresses = FakeAddresses()
    addresses.add_device(DUMMY_DEVICE)
    kernel = CodecBackends(
        HostIPVS(channels["ipvs"]),
        HostAddresses(addresses, channels["addresses"]),
        HostIPSets(ipsets, channels["ipsets"]),
        iptables,
        FakeConntrack(),
        FakeSysctls({**FRESH_NODE, **required(False)}),
    )
    path = state_dir / f"state-{time.monotonic_ns()}.json"
    dp = Dataplane(NODE, kernel, path, rules_config=RULES)
    dp.statefile = HostStateFile(path, seconds)
    dp.state = dp.statefile.open()
    return Host(dp, kernel, channels, seconds)


@dataclass
class SyncWork:
    """The host-side work of one sync: seconds per phase and what would be sent."""

    seconds: dict[str, float]
    messages: dict[str, int]
    bytes: int
    writes: int
    reads: int  # virtual servers read back from the kernel (to drain)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    @property
    def planner(self) -> float:
        """plan + diff: everything but encoding, the state file and the collector."""
        return self.seconds["plan"] + self.seconds["sync"]


def _synced(host: Host, event: Callable[[], None]) -> SyncWork:
    """``event`` (update_service calls), then one sync, as the daemon's runner does them."""
    seconds, dp = host.seconds, host.dp
    for phase in seconds:
        seconds[phase] = 0.0
    messages, size, reads = host.messages(), host.bytes(), host.reads()
    results: list[SyncResult] = []

    def replan_and_sync() -> SyncResult:
        start = time.perf_counter()
        event()
        seconds["plan"] += time.perf_counter() - start
        start = time.perf_counter()
        results.append(dp.sync())
        seconds["sync"] += time.perf_counter() - start
        return results[0]

    start = time.perf_counter()
    gc_tuning.paused_for(replan_and_sync, lambda r: r.full)
    total = time.perf_counter() - start
    result = results[0]
    if result.errors:
        raise RuntimeError(f"sync failed: {result.errors[:3]}")
    seconds["sync"] -= seconds["encode"] + seconds["save"]
    seconds["gc"] = total - seconds["plan"] - seconds["sync"] - seconds["encode"] - seconds["save"]
    seconds["encode"] -= seconds["kernel"]  # the fake kernel's answers: not ipvsproxy's work
    now = host.messages()
    return SyncWork(
        {phase: seconds[phase] for phase in PHASES},
        {k: now[k] - messages[k] for k in now},
        host.bytes() - size,
        result.writes,
        host.reads() - reads,
    )


Entry = tuple[str, dict[str, Any] | None, list[dict[str, Any]]]


def update_all(dp: Dataplane, entries: Sequence[Entry]) -> Callable[[], None]:
    def run() -> None:
        for key, svc, slices in entries:
            error = dp.update_service(key, svc, slices)
            if error is not None:
                raise RuntimeError(error)

    return run


def cold_sync(host: Host, cluster: list[synthetic.ServiceEntry]) -> SyncWork:
    """The first sync: every Service planned, then a reconcile against an empty kernel."""
    return _synced(host, update_all(host.dp, cluster))


def one_change(
    host: Host, key: str, svc: dict[str, Any] | None, slices: list[dict[str, Any]]
) -> SyncWork:
    """One event (``svc`` None: the Service was deleted) and the incremental sync after it."""
    return _synced(host, update_all(host.dp, [(key, svc, slices)]))


def _median(values: list[float]) -> float:
    return statistics.median(values)


def measure_cold(
    services: int, endpoints: int, runs: int = COLD_RUNS, seed: int = 0
) -> dict[str, Any]:
    cluster = synthetic.cluster(services, endpoints, seed)
    works: list[SyncWork] = []
    facts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            host = new_host(Path(tmp))
            works.append(cold_sync(host, cluster))
            dp = host.dp
            facts = {
                "virtual_servers": len(dp.desired.virtual_servers),
                "real_servers": sum(len(rs) for rs in dp.desired.real_servers.values()),
            }
            host.close()
            del host, dp
    real_servers = facts["real_servers"]
    planner_s = _median([w.planner for w in works])
    total_s = _median([w.total for w in works])
    last = works[-1]
    return {
        "runs": runs,
        **facts,
        "phases_s": {p: _median([w.seconds[p] for w in works]) for p in PHASES},
        "planner_s": planner_s,
        "planner_us_per_service": planner_s / services * 1e6 if services else 0.0,
        "total_s": total_s,
        "us_per_real_server": total_s / real_servers * 1e6 if real_servers else 0.0,
        "messages": dict(last.messages),
        "message_bytes": last.bytes,
        "writes": last.writes,
    }


def _busiest(dp: Dataplane, cluster: list[synthetic.ServiceEntry]) -> int:
    """The index of the Service with the most virtual servers (ties: the first)."""
    sizes = [len(dp.desired.plans[key].virtual_servers) for key, _, _ in cluster]
    return max(range(len(sizes)), key=lambda i: (sizes[i], -i))


def measure_changes(
    services: int, endpoints: int, runs: int = CHANGE_RUNS, seed: int = 0
) -> dict[str, Any]:
    cluster = synthetic.cluster(services, endpoints, seed)
    out: dict[str, Any] = {"runs": runs}
    with tempfile.TemporaryDirectory() as tmp:
        host = new_host(Path(tmp))
        cold_sync(host, cluster)
        dp = host.dp
        index = _busiest(dp, cluster)
        key, svc, base = cluster[index]
        out["service"] = key
        out["virtual_servers"] = len(dp.desired.plans[key].virtual_servers)
        new_key, new_svc, new_slices = synthetic.new_service(cluster, seed)

        Step = Callable[[], SyncWork]
        cases: dict[str, tuple[Step, Step]] = {
            "endpoint_added": (
                _event(host, key, svc, synthetic.with_endpoint_added(base)),
                _event(host, key, svc, base),
            ),
            "endpoint_removed": (
                _event(host, key, svc, synthetic.with_endpoint_removed(base)),
                _event(host, key, svc, base),
            ),
            "endpoint_not_ready": (
                _event(host, key, svc, synthetic.with_endpoint_not_ready(base)),
                _event(host, key, svc, base),
            ),
            "service_added": (
                _event(host, new_key, new_svc, new_slices),
                _event(host, new_key, None, []),
            ),
            "service_deleted": (
                _event(host, key, None, []),
                _event(host, key, svc, base),
            ),
        }
        for name, (change, undo) in cases.items():
            works = []
            for _ in range(runs):
                works.append(change())
                undo()
            first = works[0]
            out[name] = {
                "planner_us": _median([w.planner for w in works]) * 1e6,
                "total_us": _median([w.total for w in works]) * 1e6,
                "phases_us": {p: _median([w.seconds[p] for w in works]) * 1e6 for p in PHASES},
                "messages": sum(first.messages.values()),
                "writes": first.writes,
                "reads": first.reads,
            }
        host.close()
    return out


WIDE_PORTS = (500, 1000, 2000, 4000)
WIDE_ENDPOINTS = 10
WIDE_RUNS = 5


def wide_service(ports: int, endpoints: int, extra: int = 0) -> synthetic.ServiceEntry:
    """One Service of ``ports`` named ports and ``endpoints`` (+ ``extra``) endpoints."""
    spec_ports = [{"name": f"p{i}", "port": 1 + i, "protocol": "TCP"} for i in range(ports)]
    svc = {
        "metadata": {"name": "wide", "namespace": "bench"},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.255.1", "ports": spec_ports},
    }
    slice_ports = [{"name": f"p{i}", "port": 10_000 + i, "protocol": "TCP"} for i in range(ports)]
    eps = [
        {"addresses": [f"10.250.{i // 250}.{i % 250 + 1}"], "conditions": {"ready": True}}
        for i in range(endpoints + extra)
    ]
    sl = {
        "metadata": {"name": "wide-1", "namespace": "bench"},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": slice_ports,
    }
    return "bench/wide", svc, [sl]


def measure_wide(
    sizes: Sequence[int] = WIDE_PORTS, endpoints: int = WIDE_ENDPOINTS, runs: int = WIDE_RUNS
) -> list[dict[str, Any]]:
    """One endpoint added to a Service of many ports (the planner must be linear in ports x
    endpoints: the time per port and endpoint stays flat as ports grow)."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ports in sizes:
            host = new_host(Path(tmp))
            base = wide_service(ports, endpoints)
            grown = wide_service(ports, endpoints, extra=1)
            cold_sync(host, [base])
            works = []
            for _ in range(runs):
                works.append(one_change(host, *grown))
                one_change(host, *base)
            planner = _median([w.planner for w in works])
            rows.append(
                {
                    "ports": ports,
                    "endpoints": endpoints,
                    "runs": runs,
                    "planner_ms": planner * 1e3,
                    "planner_us_per_port_endpoint": planner / (ports * endpoints) * 1e6,
                    "writes": works[0].writes,
                }
            )
            host.close()
    return rows


def _event(
    host: Host, key: str, svc: dict[str, Any] | None, slices: list[dict[str, Any]]
) -> Callable[[], SyncWork]:
    return lambda: one_change(host, key, svc, slices)


CHANGES = (
    "endpoint_added",
    "endpoint_removed",
    "endpoint_not_ready",
    "service_added",
    "service_deleted",
)
ENDPOINT_CHANGES = CHANGES[:3]


def run(
    services: int = 10_000,
    endpoints: int = 10,
    seed: int = 0,
    cold_runs: int = COLD_RUNS,
    change_runs: int = CHANGE_RUNS,
) -> dict[str, Any]:
    """Every host measurement for one cluster size, as a JSON-ready dict."""
    cold = measure_cold(services, endpoints, cold_runs, seed)
    change = measure_changes(services, endpoints, change_runs, seed)
    worst_us = max(change[c]["planner_us"] for c in ENDPOINT_CHANGES)
    worst_total_us = max(change[c]["total_us"] for c in ENDPOINT_CHANGES)
    wide = measure_wide()
    return {
        "services": services,
        "endpoints": endpoints,
        "seed": seed,
        "cold": cold,
        "change": change,
        "wide": wide,
        "targets": {
            "change_planner_us": worst_us,
            "change_under_1ms": worst_us < CHANGE_TARGET_US,
            "change_total_us": worst_total_us,
            "change_total_under_1ms": worst_total_us < CHANGE_TARGET_US,
            "cold_us_per_real_server": cold["us_per_real_server"],
            "cold_per_real_server_under_10us": cold["us_per_real_server"]
            <= PER_REAL_SERVER_TARGET_US,
        },
    }


def table(result: dict[str, Any]) -> str:
    cold, change, targets = result["cold"], result["change"], result["targets"]
    ph = cold["phases_s"]
    lines = [
        f"Host benchmark (no kernel): {result['services']:,} Services x "
        f"{result['endpoints']} endpoints: {cold['virtual_servers']:,} virtual servers, "
        f"{cold['real_servers']:,} real servers",
        "",
        f"Cold sync (median of {cold['runs']})",
        f"  planner (plan + diff)        {cold['planner_s']:8.3f} s"
        f"   {cold['planner_us_per_service']:8.1f} us/Service",
        "  phases                       " + "  ".join(f"{p} {ph[p]:.3f} s" for p in PHASES),
        f"  messages encoded             ipvs {cold['messages']['ipvs']:,}, addresses "
        f"{cold['messages']['addresses']:,}, ipsets {cold['messages']['ipsets']:,}"
        f" ({cold['message_bytes'] / 1e6:.1f} MB)",
        f"  host CPU, all phases         {cold['total_s']:8.3f} s"
        f"   {cold['us_per_real_server']:8.2f} us/real server   (target <= 10)",
        "",
        f"One change in {change['service']} ({change['virtual_servers']} virtual servers),"
        f" median of {change['runs']}",
        f"  {'change':22} {'plan+diff us':>12} {'all us':>8} {'messages':>9}   phases us",
    ]
    for name in CHANGES:
        c = change[name]
        phases = " ".join(f"{p} {c['phases_us'][p]:.0f}" for p in PHASES)
        lines.append(
            f"  {name:22} {c['planner_us']:12.0f} {c['total_us']:8.0f}"
            f" {c['messages']:9d}   {phases}"
        )
    lines += [
        "",
        f"One endpoint added to a Service of many ports x {WIDE_ENDPOINTS} endpoints"
        f" (median of {WIDE_RUNS})",
        f"  {'ports':>6} {'plan+diff ms':>13} {'us per port x endpoint':>23} {'writes':>7}",
    ]
    for row in result["wide"]:
        lines.append(
            f"  {row['ports']:6d} {row['planner_ms']:13.1f}"
            f" {row['planner_us_per_port_endpoint']:23.2f} {row['writes']:7d}"
        )
    lines += [
        "",
        "Targets",
        f"  one endpoint change < 1 ms (plan + diff, worst of 3):"
        f" {targets['change_planner_us']:.0f} us"
        f" {'met' if targets['change_under_1ms'] else 'MISSED'}",
        f"  one endpoint change end to end < 1 ms (plan, diff, encode, state save; worst of 3):"
        f" {targets['change_total_us']:.0f} us"
        f" {'met' if targets['change_total_under_1ms'] else 'MISSED'}",
        f"  cold sync <= 10 us per real server: {targets['cold_us_per_real_server']:.2f} us"
        f" {'met' if targets['cold_per_real_server_under_10us'] else 'MISSED'}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.host", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--services", type=int, default=10_000)
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    result = run(args.services, args.endpoints, args.seed)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
