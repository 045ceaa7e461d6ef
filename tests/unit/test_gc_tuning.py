"""The collector stays out of syncs; a full sync freezes the survivors; once an interval has
passed, a full sync unfreezes and collects everything first."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from ipvsproxy.process.gc_tuning import Policy


@pytest.fixture(autouse=True)
def restore_gc() -> Iterator[None]:
    gc.unfreeze()
    gc.enable()
    yield
    gc.unfreeze()
    gc.enable()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Node:
    ref: object = None


def cycle(refs: list[weakref.ref[Node]]) -> None:
    a, b = Node(), Node()
    a.ref, b.ref = b, a  # garbage with a cycle: only the collector frees it
    refs.append(weakref.ref(a))


def test_no_collection_inside_a_sync_and_the_collector_back_after() -> None:
    seen: list[bool] = []
    starts: list[str] = []

    def clock(phase: str, _info: dict[str, int]) -> None:
        starts.append(phase)

    def sync() -> str:
        seen.append(gc.isenabled())
        gc.callbacks.append(clock)
        try:
            kept: list[list[list[int]]] = [
                [[], []] for _ in range(50_000)
            ]  # many gen-0 runs' worth
        finally:
            gc.callbacks.remove(clock)
        assert len(kept) == 50_000
        return "incremental"

    assert Policy().paused_for(sync, lambda r: r == "full") == "incremental"
    assert seen == [False] and starts == []
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0  # an incremental sync freezes nothing


def test_full_syncs_freeze_and_collect_everything_once_an_interval() -> None:
    clock = Clock()
    policy = Policy(interval=3600, clock=clock)
    refs: list[weakref.ref[Node]] = []

    def full_sync() -> str:
        cycle(refs)
        return "full"

    policy.paused_for(full_sync, lambda r: r == "full")
    assert gc.get_freeze_count() > 0 and gc.isenabled()
    assert refs[0]() is not None  # frozen with the rest: no collection at the first full sync
    clock.now += 60
    policy.paused_for(full_sync, lambda r: r == "full")
    assert policy.full_collects == 0
    assert refs[0]() is not None and refs[1]() is not None
    clock.now += 3600
    policy.paused_for(lambda: "full", lambda r: r == "full")
    assert policy.full_collects == 1
    assert refs[0]() is None and refs[1]() is None  # unfrozen and collected
    assert gc.get_freeze_count() > 0  # the survivors frozen again


def test_a_failing_sync_gives_the_collector_back() -> None:
    def sync() -> str:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        Policy().paused_for(sync, lambda r: True)
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    Policy().paused_for(lambda: "full", lambda r: True)
    assert not gc.isenabled()
