"""The sync runner: when to sync.

Marked Services are applied no more often than minSyncPeriod; every syncPeriod a full reconcile
reads the kernel back. A sync that did not run to its end (rules not written, or it raised) is
tried again after a backoff of 1 s, doubled at each failure up to 30 s; a Service whose
programming failed is retried when the dataplane says its retry is due.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Protocol

from ipvsproxy.daemon.changes import ChangeTracker
from ipvsproxy.dataplane.dataplane import SyncResult

log = logging.getLogger("ipvsproxy")

BACKOFF_FIRST = 1.0  # seconds before a sync that did not run to its end is tried again
BACKOFF_MAX = 30.0


class Clock(Protocol):
    """The runner's time (monotonic seconds) and its waits."""

    def monotonic(self) -> float: ...

    def wait(self, cond: threading.Condition, timeout: float) -> None:
        """With ``cond`` held: return when it is notified or ``timeout`` seconds passed."""
        ...

    def sleep(self, stop: threading.Event, seconds: float) -> bool:
        """``seconds``, or less when ``stop`` is set; returns whether it is set."""
        ...


class SystemClock:
    """time.monotonic() and the threads' own waits."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, cond: threading.Condition, timeout: float) -> None:
        cond.wait(timeout=timeout)

    def sleep(self, stop: threading.Event, seconds: float) -> bool:
        return stop.wait(seconds)


class SyncRunner:
    """Runs ``reconcile`` (a full sync) and ``apply_changes`` (the marked Services) in turn,
    until ``stop`` is set.

    ``apply_changes`` runs when ``changes`` has marks or a sync was requested, when a sync
    that did not run to its end is due again, or when ``next_retry()`` (the dataplane's next
    retry of a failed Service, on ``clock``'s monotonic time; None: none) is reached; never
    sooner than minSyncPeriod after the sync before. ``reconcile`` runs first and then every
    ``sync_period``. A sync that raises is logged, handed to ``on_exception`` and counts as
    one that did not run to its end; the runner goes on."""

    def __init__(
        self,
        changes: ChangeTracker,
        *,
        sync_period: float,
        min_sync_period: float,
        reconcile: Callable[[], SyncResult],
        apply_changes: Callable[[], SyncResult],
        next_retry: Callable[[], float | None],
        stop: threading.Event,
        on_exception: Callable[[Exception], object] = lambda _exc: None,
        clock: Clock | None = None,
    ) -> None:
        self.changes = changes
        self.sync_period = sync_period
        self.min_sync_period = min_sync_period
        self.reconcile = reconcile
        self.apply_changes = apply_changes
        self.next_retry = next_retry
        self.stop = stop
        self.on_exception = on_exception
        self.clock: Clock = clock or SystemClock()

    def wait_until(self, ready: Callable[[], bool], poll: float = 0.1) -> bool:
        """Until ``ready()``, asked every ``poll`` seconds; False when stopped first."""
        while not ready():
            if self.clock.sleep(self.stop, poll):
                return False
        return True

    def loop(self) -> None:
        """Sync until stopped."""
        clock, cond = self.clock, self.changes.cond
        # The first full sync is due at once. (0.0 would delay it until the monotonic clock,
        # which starts near 0 when the node boots, passes one sync period.)
        last_full = -math.inf
        last_sync = 0.0
        backoff, retry_at = 0.0, math.inf  # when the sync that did not run to its end is due
        while not self.stop.is_set():
            now = clock.monotonic()
            if now - last_full >= self.sync_period:
                result = self._contained(self.reconcile)
                last_full = last_sync = clock.monotonic()
            else:
                with cond:
                    due = min(last_full + self.sync_period, retry_at, self._next_retry())
                    if not self.changes.has_work():
                        clock.wait(cond, max(0.0, due - now))
                    retry = min(retry_at, self._next_retry())
                    has_work = self.changes.has_work() or retry <= clock.monotonic()
                if not has_work or self.stop.is_set():
                    continue
                pause = last_sync + self.min_sync_period - clock.monotonic()
                if pause > 0 and clock.sleep(self.stop, pause):
                    return
                result = self._contained(self.apply_changes)
                last_sync = clock.monotonic()
            if result.complete:
                backoff, retry_at = 0.0, math.inf
            else:
                backoff = min(BACKOFF_MAX, max(BACKOFF_FIRST, backoff * 2))
                retry_at = clock.monotonic() + backoff

    def _next_retry(self) -> float:
        retry = self.next_retry()
        return math.inf if retry is None else retry

    def _contained(self, sync: Callable[[], SyncResult]) -> SyncResult:
        """A sync whose exception escaped the dataplane's own containment (a bug): logged,
        handed to ``on_exception``, and the runner goes on."""
        try:
            return sync()
        except Exception as exc:
            log.exception("sync failed")
            self.on_exception(exc)
            return SyncResult(full=True, errors=[f"{type(exc).__name__}: {exc}"], complete=False)
