"""The side-by-side tables from ``bench.peers``'s JSON (pure: no I/O), and the issue's targets
as ratios of ipvsproxy to each peer measured in the same guest boot."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

SYSTEMS = ("ipvsproxy", "kube-proxy", "kube-router")
PEERS = SYSTEMS[1:]
ENDPOINT_KINDS = (
    "endpoint added",
    "endpoint removed",
    "endpoint not ready",
    "endpoint ready again",
)
KINDS = (*ENDPOINT_KINDS, "service added", "service deleted")
# (number, what, target ratio ipvsproxy / peer) at the largest size
TARGETS = (
    (1, "one endpoint change, latency (median)", 0.01),
    (2, "one endpoint change, proxy CPU (mean)", 0.02),
    (3, "cold start", 0.2),
    (4, "peak RSS", 1.0),
)


def p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _changes(runs: Sequence[dict[str, Any]], kinds: Iterable[str]) -> list[list[float]]:
    wanted = set(kinds)
    return [c for r in runs for k, cs in r["changes"].items() if k in wanted for c in cs]


def latency(runs: Sequence[dict[str, Any]], kinds: Iterable[str]) -> tuple[float, float]:
    """Median and p95 seconds from the API write to the kernel, over every change of ``kinds``
    in every run."""
    seconds = [c[0] for c in _changes(runs, kinds)]
    return statistics.median(seconds), p95(seconds)


def change_cpu(runs: Sequence[dict[str, Any]], kinds: Iterable[str]) -> float:
    """Mean CPU seconds per change, over the changes whose window held no periodic full sync.

    The lab kernel counts CPU in 10 ms ticks, so one change's figure is 0 or a few ticks and
    the mean over many is the measure; but a window (from the proxy idle before the write to
    it idle again after) that a periodic full sync fell into holds that sync's seconds too,
    which belong to the steady-state figure. Such windows are the ones over twice the median
    plus 50 ms, left out here (``cpu_outliers`` counts them)."""
    kept, _ = _typical([c[1] for c in _changes(runs, kinds)])
    return sum(kept) / len(kept)


def cpu_outliers(runs: Sequence[dict[str, Any]], kinds: Iterable[str]) -> tuple[int, int]:
    """(left out, all) of the changes' CPU windows: see change_cpu."""
    cpu = [c[1] for c in _changes(runs, kinds)]
    kept, _ = _typical(cpu)
    return len(cpu) - len(kept), len(cpu)


def _typical(values: list[float]) -> tuple[list[float], float]:
    limit = 2 * statistics.median(values) + 0.05
    return [v for v in values if v <= limit], limit


def changes_measured(runs: Sequence[dict[str, Any]]) -> str:
    """How many changes of each kind the runs hold together: one number when every kind has
    the same, else the range."""
    counts = [sum(len(r["changes"].get(k, ())) for r in runs) for k in KINDS]
    counts = [c for c in counts if c] or [0]
    low, high = min(counts), max(counts)
    return f"{low}" if low == high else f"{low}-{high}"


def own_syncs(runs: Sequence[dict[str, Any]]) -> str:
    """The mean of the proxy's own kubeproxy_sync_proxy_rules_duration_seconds over every
    IPv4 sync of the runs, up to the end of their changes ("-" where not exported); the
    IPv6 proxier's syncs, where one ran, follow. ipvsproxy's one sync counts in every family
    it serves: an IPv6 series equal to the IPv4 one is those syncs again, left out."""
    cells = []
    by_family = [r.get("own_syncs") or {} for r in runs]
    for family in ("IPv4", "IPv6"):
        # ipvsproxy's before issue 18: one series, no label
        unlabelled = "" if family == "IPv4" else None
        syncs = [
            s
            for f in by_family
            if (s := f.get(family) or f.get(unlabelled))
            and (family == "IPv4" or s != f.get("IPv4"))
        ]
        count = sum(s["count"] for s in syncs)
        if count:
            mean = _ms(sum(s["sum"] for s in syncs) / count)
            cells.append(f"{mean} ({count:.0f})" + (f" {family}" if family == "IPv6" else ""))
    return "; ".join(cells) or "-"


def per_run(runs: Sequence[dict[str, Any]], key: str, sub: str | None = None) -> list[float]:
    out = []
    for r in runs:
        value = r.get(key)
        if sub is not None and isinstance(value, dict):
            value = value.get(sub)
        if isinstance(value, int | float):
            out.append(float(value))
    return out


def spread(values: Sequence[float], fmt: str = "{:.2f}", unit: str = "") -> str:
    """The median, and the range when there is more than one run."""
    if not values:
        return "-"
    text = fmt.format(statistics.median(values)) + unit
    if len(values) > 1:
        text += f" ({fmt.format(min(values))}-{fmt.format(max(values))})"
    return text


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms" if seconds >= 0.1 else f"{seconds * 1e3:.1f} ms"


def completed(size: dict[str, Any]) -> dict[str, Any]:
    """``size`` with only the runs that completed (a failed run holds its error alone)."""
    runs = {s: [r for r in rs if "error" not in r] for s, rs in size["runs"].items()}
    return {**size, "runs": {s: rs for s, rs in runs.items() if rs}}


def failures(size: dict[str, Any]) -> list[str]:
    """A line per failed run, with the cold start it measured before failing, if it did."""
    out = []
    for s, rs in size["runs"].items():
        for i, r in enumerate(rs):
            if "error" not in r:
                continue
            line = f"- {size['services']:,} x {size['endpoints']}, {s} run {i + 1} failed: "
            line += r["error"]
            partial = r.get("partial") or {}
            if "cold_s" in partial:
                line += (
                    f" (after its cold start: {partial['cold_s']:.1f} s, "
                    f"{partial['cold_cpu_s']:.1f} s CPU)"
                )
            out.append(line)
    return out


def size_table(size: dict[str, Any]) -> list[str]:
    """One table: a row per measure, a column per system (completed runs only)."""
    size = completed(size)
    systems = list(size["runs"])
    runs = size["runs"]
    rows = [
        f"| {size['services']:,} x {size['endpoints']} | " + " | ".join(systems) + " |",
        "| --- |" + " --- |" * len(systems),
    ]

    def row(label: str, cells: Iterable[str]) -> None:
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    row("virtual / real servers", (
        f"{spread(per_run(runs[s], 'virtual_servers'), '{:,.0f}')} / "
        f"{spread(per_run(runs[s], 'real_servers'), '{:,.0f}')}" for s in systems
    ))  # fmt: skip
    row("cold start", (spread(per_run(runs[s], "cold_s"), unit=" s") for s in systems))
    row(
        "first sync ended (its own metric)",
        (spread(per_run(runs[s], "first_sync_s"), unit=" s") for s in systems),
    )
    row(
        "cold start, proxy CPU",
        (spread(per_run(runs[s], "cold_cpu_s"), unit=" s") for s in systems),
    )
    row("changes of each kind measured (all runs)", (
        changes_measured(runs[s]) for s in systems
    ))  # fmt: skip
    # A row per kind of change some system measured ("-" for one that measured none of it).
    for kind in KINDS:
        if any(_changes(runs[s], [kind]) for s in systems):
            row(f"{kind}: latency median (p95)", (
                "{} ({})".format(*(_ms(x) for x in latency(runs[s], [kind])))
                if _changes(runs[s], [kind]) else "-" for s in systems
            ))  # fmt: skip
    for label, kinds in (
        ("one endpoint change", ENDPOINT_KINDS),
        ("Service added or deleted", KINDS[4:]),
    ):
        if any(_changes(runs[s], kinds) for s in systems):
            row(f"{label}, proxy CPU (mean; windows with a periodic sync left out)", (
                "{} ({} of {} left out)".format(
                    _ms(change_cpu(runs[s], kinds)), *cpu_outliers(runs[s], kinds)
                ) if _changes(runs[s], kinds) else "-" for s in systems
            ))  # fmt: skip
    row("its own sync duration metric, mean (syncs)", (own_syncs(runs[s]) for s in systems))
    _resource_rows(runs, systems, row)
    return rows


def _resource_rows(
    runs: dict[str, Any], systems: Sequence[str], row: Callable[[str, Iterable[str]], None]
) -> None:
    """Steady state, peak RSS and restart: the rows of the parts some run measured (a scaling
    run measures neither steady state nor restart)."""

    def measured(key: str) -> bool:
        return any(key in r for s in systems for r in runs[s])

    if measured("steady"):
        for sub, label in (("idle_cpu_s_per_min", "idle"), ("busy_cpu_s_per_min", "1 change/s")):
            row(f"steady CPU, {label}", (
                spread(per_run(runs[s], "steady", sub), unit=" s/min") for s in systems
            ))  # fmt: skip
    row("peak RSS", (spread(per_run(runs[s], "peak_rss_mib"), "{:.0f}", " MiB") for s in systems))
    if not measured("restart"):
        return
    row("peak RSS: at cold start / restarted process", (
        " / ".join((
            spread(per_run(runs[s], "cold_peak_rss_mib"), "{:.0f}", " MiB"),
            spread(per_run(runs[s], "restart", "peak_rss_mib"), "{:.0f}", " MiB"),
        )) for s in systems
    ))  # fmt: skip
    row("restart: converged", (
        spread(per_run(runs[s], "restart", "converge_s"), unit=" s") for s in systems
    ))  # fmt: skip
    row("restart: IPVS / ipset / iptables lines changed", (
        " / ".join(spread(per_run(runs[s], "restart", f"{k}_changed"), "{:.0f}")
                   for k in ("ipvs", "ipset", "iptables")) for s in systems
    ))  # fmt: skip
    row("restart: kernel writes (own count)", (
        spread(per_run(runs[s], "restart", "own_writes"), "{:.0f}") for s in systems
    ))  # fmt: skip
    row("restart: established connection", (
        ", ".join(sorted({str((r.get("restart") or {}).get("connection")) for r in runs[s]}))
        for s in systems
    ))  # fmt: skip


def ratios(size: dict[str, Any], peer: str) -> dict[int, float]:
    """Target number -> ipvsproxy's figure over ``peer``'s, at this size."""
    ours, theirs = size["runs"]["ipvsproxy"], size["runs"][peer]

    def median_of(runs: Sequence[dict[str, Any]], key: str) -> float:
        return statistics.median(per_run(runs, key))

    return {
        1: latency(ours, ENDPOINT_KINDS)[0] / latency(theirs, ENDPOINT_KINDS)[0],
        2: _ratio(change_cpu(ours, ENDPOINT_KINDS), change_cpu(theirs, ENDPOINT_KINDS)),
        3: median_of(ours, "cold_s") / median_of(theirs, "cold_s"),
        4: median_of(ours, "peak_rss_mib") / median_of(theirs, "peak_rss_mib"),
    }


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs > 0 else float("inf")


def targets_table(size: dict[str, Any]) -> list[str]:
    size = completed(size)
    peers = [p for p in PEERS if p in size["runs"]]
    rows = [
        f"| # | at {size['services']:,} x {size['endpoints']}: ipvsproxy / peer | target | "
        + " | ".join(peers)
        + " |",
        "| --- | --- | --- |" + " --- |" * len(peers),
    ]
    by_peer = {p: ratios(size, p) for p in peers}
    for number, what, target in TARGETS:
        cells = []
        for p in peers:
            value = by_peer[p][number]
            verdict = "met" if value <= target else "**missed**"
            shown = f"{value:.3f}" if value >= 0.001 else f"{value:.1e}"  # not 0.000
            cells.append(f"{shown} ({verdict})")
        rows.append(f"| {number} | {what} | <= {target} | " + " | ".join(cells) + " |")
    return rows


def scaling_points(data: dict[str, Any]) -> list[dict[str, Any]]:
    """For the chart: per size, each system's median one-endpoint-change latency."""
    return [
        {
            "services": size["services"],
            "endpoints": size["endpoints"],
            **{s: latency(runs, ENDPOINT_KINDS)[0] for s, runs in size["runs"].items()},
        }
        for size in map(completed, data["sizes"])
    ]


def report(data: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for size in data["sizes"]:
        lines += [*size_table(size), "", *failures(size)]
    largest = completed(max(data["sizes"], key=lambda s: s["services"]))
    if "ipvsproxy" in largest["runs"] and any(p in largest["runs"] for p in PEERS):
        lines += [*targets_table(largest), ""]
    return lines
