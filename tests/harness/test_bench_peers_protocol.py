"""bench.peers's protocol: the change budget (a system whose changes take minutes gets fewer
rounds, the same number of each kind, and always the first round) and when a proxy's first
sync has ended by its own metric (kube-proxy's per IP family, ipvsproxy's one series), and
when a cold start has ended (the last virtual server in, found without reading the whole table
over and over)."""

from __future__ import annotations

from typing import Any

import pytest

from bench import peers, proc


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def fake_pairs(clock: Clock, seconds: float) -> Any:
    def pairs(api: object, e: object, kind: int, endpoints: int) -> list[peers.Change]:
        def write() -> None:
            clock.now += seconds

        name = peers.KIND_NAMES[kind]
        return [
            peers.Change(f"{name} on", write, lambda p: True),
            peers.Change(f"{name} off", write, lambda p: True),
        ]

    return pairs


@pytest.mark.parametrize(
    ("seconds", "budget", "rounds"),
    [(0.01, float("inf"), 5), (0.01, 3600, 5), (30, 250, 2), (1000, 1, 1)],
)
def test_no_round_starts_once_the_budget_is_spent(
    monkeypatch: pytest.MonkeyPatch, seconds: float, budget: float, rounds: int
) -> None:
    clock = Clock()
    monkeypatch.setattr("bench.peers.time.monotonic", clock.monotonic)
    monkeypatch.setattr(peers, "change_pairs", fake_pairs(clock, seconds))
    monkeypatch.setattr(proc, "wait_idle", lambda pid: 0.0)
    cluster = peers.Objects(
        [peers.entry(i, 2) for i in range(30)], peers.conn_entry("10.244.1.2"), 2
    )
    out = peers.run_changes(object(), cluster, 1, object(), 5, [0, 1, 2], 60.0, budget)  # type: ignore[arg-type]
    assert {k: len(v) for k, v in out.items()} == {
        f"{k} {d}": rounds for k in peers.KIND_NAMES for d in ("on", "off")
    }


KUBE_PROXY_METRICS = """# TYPE kubeproxy_sync_proxy_rules_last_timestamp_seconds gauge
kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family="IPv4"}} {v4}
kubeproxy_sync_proxy_rules_last_timestamp_seconds{{ip_family="IPv6"}} {v6}
"""


@pytest.mark.parametrize(
    ("text", "done"),
    [
        (KUBE_PROXY_METRICS.format(v4=0, v6=0), False),
        (KUBE_PROXY_METRICS.format(v4=1.7e9, v6=0), False),  # its IPv6 proxier not yet
        (KUBE_PROXY_METRICS.format(v4=1.7e9, v6=1.7e9), True),
        ("kubeproxy_sync_proxy_rules_last_timestamp_seconds 0\n", False),
        ("kubeproxy_sync_proxy_rules_last_timestamp_seconds 1.7e9\n", True),
        ("# not yet registered\n", False),
    ],
)
def test_the_first_sync_has_ended_when_every_series_is_set(
    monkeypatch: pytest.MonkeyPatch, text: str, done: bool
) -> None:
    monkeypatch.setattr(peers, "http_get_from", lambda ns, url: (200, text))
    assert peers.first_sync_done("node-1") is done


class Programming:
    """A kernel a proxy fills at one virtual server per 10 ms of a fake clock; each read of
    one virtual server costs 1 ms, each read of the whole table 2 s."""

    def __init__(self, clock: Clock, keys: list[Any], dests: set[Any], removed: Any = None):
        self.clock, self.keys, self.dests, self.removed = clock, keys, dests, removed
        self.whole_reads = 0

    def held(self) -> list[Any]:
        n = int(self.clock.now / 0.01)
        return [k for k in self.keys[:n] if k != self.removed]

    def active(self, vs: Any) -> set[Any] | None:
        self.clock.now += 0.001
        return set(self.dests) if vs in self.held() else None

    def table(self) -> dict[Any, dict[Any, int]]:
        held = self.held()  # the state as the read starts; it ends 2 s later
        self.clock.now += 2.0
        self.whole_reads += 1
        return {vs: dict.fromkeys(self.dests, 1) for vs in held}


@pytest.mark.parametrize("count", [1, 40, 2000])
def test_the_cold_start_ends_when_the_last_virtual_server_is_in_and_reads_little(
    monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    clock = Clock()
    monkeypatch.setattr("bench.peers.time.monotonic", clock.monotonic)
    monkeypatch.setattr("bench.peers.time.sleep", lambda s: setattr(clock, "now", clock.now + s))
    keys = [("TCP", f"10.96.{i // 250}.{i % 250}", 80) for i in range(count)]
    dests = {("10.244.1.2", 8080)}
    kernel = Programming(clock, keys, dests)
    expected = dict.fromkeys(keys, dests)
    at = peers.wait_programmed(expected, 3600, kernel.active, kernel.table)
    last_in = count * 0.01
    assert at >= last_in  # never before the kernel holds them all
    # Late by less than one read of the whole table, which is read at most three times.
    assert at - last_in < 2.0, (at, last_in)
    assert kernel.whole_reads <= 3, kernel.whole_reads


def test_the_cold_start_waits_for_a_virtual_server_that_went_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr("bench.peers.time.monotonic", clock.monotonic)
    monkeypatch.setattr("bench.peers.time.sleep", lambda s: setattr(clock, "now", clock.now + s))
    keys = [("UDP", f"10.96.0.{i}", 53) for i in range(100)]
    dests = {("10.244.1.2", 5353)}
    kernel = Programming(clock, keys, dests, removed=keys[7])
    with pytest.raises(TimeoutError, match="cold start: not seen within 60 s"):
        peers.wait_programmed(dict.fromkeys(keys, dests), 60, kernel.active, kernel.table)
