"""When Python's cyclic garbage collector may run: not inside a sync.

A cold sync at 10,000 Services builds a few million long-lived objects. Python starts a full
collection each time the surviving objects grow by a quarter, and each one scans them all:
measured on the host, more than half of the cold sync's CPU went there (bench/host.py), for
nothing, since the planner's values hold no reference cycles and are freed by reference
counting. So a sync runs with the collector off. After a full sync the collector runs once and
what survives is frozen (``gc.freeze``): later collections, started by the watch threads'
allocations between syncs, scan only young objects, not the whole desired state. The next full
sync unfreezes first, so a cycle that became garbage is collected within one sync period.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")


def paused_for(sync: Callable[[], R], full: Callable[[R], bool]) -> R:
    """Run ``sync`` with the collector off; after a full one, collect once and freeze."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        result = sync()
        if full(result):
            gc.unfreeze()
            gc.collect()
            gc.freeze()
        return result
    finally:
        if enabled:
            gc.enable()
