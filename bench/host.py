"""Host-side benchmarks (no kernel): what a sync costs in Python before any system call.

``python -m bench.host [--services N] [--endpoints E] [--json]``

Everything runs through the functions the Dataplane itself uses: ``Dataplane.update_service``
(plan_service + DesiredState.update), the dataplane's pure diff step (``all_keys``,
``address_ops``, ``service_ops``, ``member_ops``), ``rules.render``, ``Dataplane._record`` for
the cache bookkeeping, and the backends' own encoders (``backends.ipvs.encode``,
``backends.addresses.encode``, ``backends.ipset.encode``). Only the system calls are left out:
the encoded requests are counted, never sent, and every operation is taken as accepted.

1. Cold sync of the synthetic cluster (``bench.synthetic``), as the first ``sync()`` (a
   reconcile of an empty kernel) does it: every Service planned, everything diffed against an
   empty kernel, every netlink message of the IPVS, address and ipset backends encoded, the
   iptables rules rendered. Median of 3 runs. Figures: the planner (plan + diff) in total and
   per Service; and the host CPU per real server (plan + diff + rules + encode + record: the
   issue's "planning + diffing + encoding", and the cache bookkeeping a real sync does too).
2. One change in that cluster, as ``update_service`` + an incremental ``sync()`` (which diffs
   only the keys the change touched): one endpoint added, removed, flipped not ready, and one
   Service added and deleted, in the Service with the most virtual servers. Median of 101 runs
   each; each timed change is undone (untimed) before the next. The real sync also reads back
   the dump of each virtual server that loses a real server (draining needs the kernel's
   connection counts): that is I/O, counted as ``reads``, not timed.

Times are wall-clock (``time.perf_counter``) with Python's cyclic garbage collector running as
it does in the daemon; the time it took is also shown apart (``gc_s``, through
``gc.callbacks``). The state file a real sync saves afterwards is JSON written to disk: shown
apart (``state_save_ms``), not in any of the totals.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import synthetic
from ipvsproxy import ipsets as S
from ipvsproxy import rules
from ipvsproxy.backends import addresses as addresses_backend
from ipvsproxy.backends import ipset as ipset_backend
from ipvsproxy.backends import ipvs as ipvs_backend
from ipvsproxy.dataplane import (
    Backends,
    Dataplane,
    _Observed,
    address_ops,
    all_keys,
    member_ops,
    service_ops,
)
from ipvsproxy.desired import Changes
from ipvsproxy.diff import AddressOp, DestOp, MemberOp, OpKind, ServiceOp
from ipvsproxy.model import SERVICE_ORDER, DestKey, ServiceKey
from ipvsproxy.netlink import ipvs_messages
from ipvsproxy.plan import NodeFacts

NODE_IP = "192.168.56.11"
NODE = NodeFacts(
    name="node-1",
    node_ips=(NODE_IP,),
    local_addresses=frozenset({NODE_IP}),
    primary_ip=NODE_IP,
)
RULES = rules.RulesConfig(cluster_cidr="10.244.0.0/16")
IPVS_FAMILY_ID = 0x1C  # any generic netlink family id: nothing is sent
DUMMY_IFINDEX = 1000
COLD_RUNS = 3
CHANGE_RUNS = 101
CHANGE_TARGET_US = 1000.0
PER_REAL_SERVER_TARGET_US = 10.0
PHASES = ("plan", "diff", "rules", "encode", "record")


class _NoConntrack:
    """Conntrack entries of deleted UDP real servers are not flushed here (that is I/O)."""

    def forget(self, service: ServiceKey, dest: DestKey) -> None:
        pass


def new_dataplane(state_dir: Path) -> Dataplane:
    """A Dataplane without backends, its kernel cache as after reading an empty kernel."""
    unused: Any = None  # nothing here reaches a backend but conntrack's forget
    conntrack: Any = _NoConntrack()
    backends = Backends(unused, unused, unused, unused, conntrack, unused)
    dp = Dataplane(NODE, backends, state_dir / "state.json", rules_config=RULES)
    dp.observed = _Observed({}, {}, set(), {name: set() for name in S.NAMES}, None)
    return dp


@dataclass
class SyncWork:
    """The host-side work of one sync: seconds per phase and what would be sent."""

    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    messages: dict[str, int] = field(
        default_factory=lambda: {"ipvs": 0, "addresses": 0, "ipsets": 0}
    )
    bytes: int = 0
    reads: int = 0  # virtual servers the real sync would read back first (to drain)
    gc_seconds: float = 0.0  # of the phases' time, spent in the cyclic garbage collector

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    @property
    def planner(self) -> float:
        return self.seconds["plan"] + self.seconds["diff"]


class GCClock:
    """Time spent in the cyclic garbage collector while in use (through ``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start

    def __enter__(self) -> GCClock:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


class Seq:
    def __init__(self) -> None:
        self.value = 0

    def next(self) -> int:
        self.value += 1
        return self.value


def converge(dp: Dataplane, changes: Changes, work: SyncWork) -> None:
    """``Dataplane._converge`` without system calls: diff, render, encode, record."""
    obs = dp.observed
    assert obs is not None
    clock = time.perf_counter
    t0 = clock()
    # The diff step of _bind, _services, _members and _unbind, in that order.
    binds = [
        op
        for op in address_ops(dp.desired, changes.addresses, obs.bound, dp.owns_address)
        if op.kind is OpKind.ADD
    ]
    for key in sorted(changes.services, key=SERVICE_ORDER):  # as _services does, minus reads
        if key not in dp.desired.virtual_servers:
            continue
        want = dp.desired.real_servers[key]
        if any(d not in want for d in obs.dests.get(key, {})):
            work.reads += 1
    ipvs_ops = service_ops(
        dp.desired, changes.services, obs.services, obs.dests, dp.owns_service, dp._expired
    )
    members = member_ops(dp.desired, changes.members, obs.members)
    unbinds = [
        op
        for op in address_ops(dp.desired, changes.addresses, obs.bound, dp.owns_address)
        if op.kind is OpKind.DELETE
    ]
    t1 = clock()
    text = rules.render(dp.rules_config, dp.desired.nonempty_sets(), dp.desired.out_filters())
    t2 = clock()
    seq = Seq()
    enc = ipvs_messages.Encoder(IPVS_FAMILY_ID)
    size = 0
    for aop in binds:
        size += len(addresses_backend.encode(seq.next(), DUMMY_IFINDEX, aop))
    for iop in ipvs_ops:
        size += len(ipvs_backend.encode(enc, seq.next(), iop))
    for mop in members:
        size += len(ipset_backend.encode(seq.next(), mop))
    for aop in unbinds:
        size += len(addresses_backend.encode(seq.next(), DUMMY_IFINDEX, aop))
    t3 = clock()
    _record_all(dp, binds, ipvs_ops, members, unbinds)
    if text != obs.rules_text:
        obs.rules_text = text
    t4 = clock()
    for phase, seconds in zip(PHASES[1:], (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
        work.seconds[phase] += seconds
    work.messages["ipvs"] += len(ipvs_ops)
    work.messages["addresses"] += len(binds) + len(unbinds)
    work.messages["ipsets"] += len(members)
    work.bytes += size


def _record_all(
    dp: Dataplane,
    binds: list[AddressOp],
    ipvs_ops: list[ServiceOp | DestOp],
    members: list[MemberOp],
    unbinds: list[AddressOp],
) -> None:
    """What the Dataplane's steps record once the kernel has accepted everything."""
    obs = dp.observed
    assert obs is not None
    obs.bound.update(op.address for op in binds)
    dp._record(ipvs_ops)
    for op in members:
        target = obs.members.setdefault(op.set_name, set())
        (target.add if op.kind is OpKind.ADD else target.discard)(op.entry)
    obs.bound.difference_update(op.address for op in unbinds)


def plan(dp: Dataplane, entries: list[synthetic.ServiceEntry], work: SyncWork) -> None:
    """What the daemon does per event: ``update_service`` for each Service."""
    start = time.perf_counter()
    for key, svc, slices in entries:
        error = dp.update_service(key, svc, slices)
        if error is not None:
            raise RuntimeError(error)
    work.seconds["plan"] += time.perf_counter() - start


def cold_sync(dp: Dataplane, cluster: list[synthetic.ServiceEntry]) -> SyncWork:
    """The first sync: every Service planned, then a reconcile against an empty kernel."""
    work = SyncWork()
    with GCClock() as gc_clock:
        plan(dp, cluster, work)
        obs = dp.observed
        assert obs is not None
        start = time.perf_counter()
        dp.pending = Changes()  # reconcile drops what is pending and compares everything
        everything = all_keys(dp.desired, obs.services, obs.bound, obs.members)
        work.seconds["diff"] += time.perf_counter() - start
        converge(dp, everything, work)
    work.gc_seconds = gc_clock.seconds
    return work


def one_change(
    dp: Dataplane, key: str, svc: dict[str, Any] | None, slices: list[dict[str, Any]]
) -> SyncWork:
    """One event (``svc`` None: the Service was deleted) and the incremental sync after it."""
    work = SyncWork()
    with GCClock() as gc_clock:
        start = time.perf_counter()
        error = dp.update_service(key, svc, slices)
        work.seconds["plan"] += time.perf_counter() - start
        if error is not None:
            raise RuntimeError(error)
        changes, dp.pending = dp.pending, Changes()
        converge(dp, changes, work)
    work.gc_seconds = gc_clock.seconds
    return work


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _quiet() -> None:
    gc.collect()


def measure_cold(
    services: int, endpoints: int, runs: int = COLD_RUNS, seed: int = 0
) -> dict[str, Any]:
    cluster = synthetic.cluster(services, endpoints, seed)
    works: list[SyncWork] = []
    facts: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(runs):
            dp = new_dataplane(Path(tmp))
            _quiet()
            works.append(cold_sync(dp, cluster))
            facts = {
                "virtual_servers": len(dp.desired.virtual_servers),
                "real_servers": sum(len(rs) for rs in dp.desired.real_servers.values()),
            }
            del dp
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
        # Included in the figures above; apart, to show what the code itself costs.
        "gc_s": _median([w.gc_seconds for w in works]),
        "us_per_real_server_without_gc": (
            _median([w.total - w.gc_seconds for w in works]) / real_servers * 1e6
            if real_servers
            else 0.0
        ),
        "messages": dict(last.messages),
        "message_bytes": last.bytes,
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
        dp = new_dataplane(Path(tmp))
        cold_sync(dp, cluster)
        index = _busiest(dp, cluster)
        key, svc, base = cluster[index]
        out["service"] = key
        out["virtual_servers"] = len(dp.desired.plans[key].virtual_servers)
        new_key, new_svc, new_slices = synthetic.new_service(cluster, seed)

        Step = Callable[[], SyncWork]
        cases: dict[str, tuple[Step, Step]] = {
            "endpoint_added": (
                _event(dp, key, svc, synthetic.with_endpoint_added(base)),
                _event(dp, key, svc, base),
            ),
            "endpoint_removed": (
                _event(dp, key, svc, synthetic.with_endpoint_removed(base)),
                _event(dp, key, svc, base),
            ),
            "endpoint_not_ready": (
                _event(dp, key, svc, synthetic.with_endpoint_not_ready(base)),
                _event(dp, key, svc, base),
            ),
            "service_added": (
                _event(dp, new_key, new_svc, new_slices),
                _event(dp, new_key, None, []),
            ),
            "service_deleted": (
                _event(dp, key, None, []),
                _event(dp, key, svc, base),
            ),
        }
        _quiet()
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
                "gc_us": _median([w.gc_seconds for w in works]) * 1e6,
                "messages": sum(first.messages.values()),
                "reads": first.reads,
            }
        start = time.perf_counter()
        dp.statefile.save(dp.state)  # the full state: what a sync after a change rewrites
        out["state_save_ms"] = (time.perf_counter() - start) * 1e3
    return out


def _event(
    dp: Dataplane, key: str, svc: dict[str, Any] | None, slices: list[dict[str, Any]]
) -> Callable[[], SyncWork]:
    return lambda: one_change(dp, key, svc, slices)


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
    return {
        "services": services,
        "endpoints": endpoints,
        "seed": seed,
        "cold": cold,
        "change": change,
        "targets": {
            "change_planner_us": worst_us,
            "change_under_1ms": worst_us < CHANGE_TARGET_US,
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
        f"    of which cyclic GC         {cold['gc_s']:8.3f} s"
        f"   without it: {cold['us_per_real_server_without_gc']:.2f} us/real server",
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
        f"  state file save after a change (not counted above): {change['state_save_ms']:.1f} ms",
        "",
        "Targets",
        f"  one endpoint change < 1 ms (plan + diff, worst of 3):"
        f" {targets['change_planner_us']:.0f} us"
        f" {'met' if targets['change_under_1ms'] else 'MISSED'}",
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
