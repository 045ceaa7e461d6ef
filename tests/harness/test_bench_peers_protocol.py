"""bench.peers's protocol: the change budget (a system whose changes take minutes gets fewer
rounds, the same number of each kind, and always the first round) and when a proxy's first
sync has ended by its own metric (kube-proxy's per IP family, ipvsproxy's one series)."""

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
