"""When Python's cyclic garbage collector may run: not inside a sync, and rarely over the
long-lived state.

A cold sync builds a few long-lived objects per real server, millions in a large cluster.
Python starts a full collection each time the surviving objects grow by a quarter, and each one
scans them all: work for nothing, since the planner's values hold no reference cycles and are
freed by reference counting when replaced. So a sync runs with the collector off, and after a
full sync what survives is frozen (``gc.freeze``, a constant-time move): later collections,
started by the watch threads' allocations, scan only young objects, not the whole desired
state. A cycle that dies among the frozen objects would wait for an unfreeze, so at most once
an interval (an hour) a full sync also unfreezes and collects everything, a pause in proportion
to the whole state, before freezing again. (What the collector cost and costs: see
docs/performance.md.)
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")

FULL_COLLECT_INTERVAL_S = 3600.0


class Policy:
    def __init__(
        self,
        interval: float = FULL_COLLECT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.clock = clock
        self.last_full_collect: float | None = None
        self.full_collects = 0

    def paused_for(self, sync: Callable[[], R], full: Callable[[R], bool]) -> R:
        """Run ``sync`` with the collector off; after a full one, freeze what survives."""
        enabled = gc.isenabled()
        gc.disable()
        try:
            result = sync()
            if full(result):
                self._after_full_sync()
            return result
        finally:
            if enabled:
                gc.enable()

    def _after_full_sync(self) -> None:
        now = self.clock()
        if self.last_full_collect is None:
            self.last_full_collect = now  # the first: nothing old to reclaim yet
        elif now - self.last_full_collect >= self.interval:
            gc.unfreeze()
            gc.collect()
            self.last_full_collect = now
            self.full_collects += 1
        gc.freeze()


_DEFAULT = Policy()


def paused_for(sync: Callable[[], R], full: Callable[[R], bool]) -> R:
    """The process's policy (one collector per process, so one policy)."""
    return _DEFAULT.paused_for(sync, full)
