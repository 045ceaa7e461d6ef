"""The collector stays out of syncs; a full sync leaves the survivors frozen."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from ipvsproxy.gcpolicy import paused_for


@pytest.fixture(autouse=True)
def restore_gc() -> Iterator[None]:
    gc.unfreeze()
    gc.enable()
    yield
    gc.unfreeze()
    gc.enable()


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
            ]  # enough to start many gen-0 collections
        finally:
            gc.callbacks.remove(clock)
        assert len(kept) == 50_000
        return "incremental"

    assert paused_for(sync, lambda r: r == "full") == "incremental"
    assert seen == [False] and starts == []
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_full_sync_collects_once_then_freezes() -> None:
    class Node:
        ref: object = None

    refs: list[weakref.ref[Node]] = []

    def sync() -> str:
        a, b = Node(), Node()
        a.ref, b.ref = b, a  # garbage with a cycle, left for the collector
        refs.append(weakref.ref(a))
        return "full"

    gc.unfreeze()
    paused_for(sync, lambda r: r == "full")
    assert gc.isenabled()
    assert gc.get_freeze_count() > 0
    assert refs[0]() is None  # the cycle was collected, not frozen


def test_a_failing_sync_gives_the_collector_back() -> None:
    def sync() -> str:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        paused_for(sync, lambda r: True)
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    paused_for(lambda: "full", lambda r: True)
    assert not gc.isenabled()
