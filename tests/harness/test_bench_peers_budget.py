"""bench.peers's change budget: a system whose changes take minutes gets fewer rounds, the
same number of each kind, and always the first round."""

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
