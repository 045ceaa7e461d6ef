"""The sync runner decides when to sync: the marked Services at most every minSyncPeriod, a full
reconcile every syncPeriod, a failed Service at its retry time, a sync that did not run to its
end again after a backoff. Driven here by a simulated clock: every wait returns at once, with
the time advanced to its end or to the next scheduled event (a change, a stop)."""

from __future__ import annotations

import functools
import heapq
import itertools
import threading
from collections.abc import Callable

import pytest

from ipvsproxy.daemon.changes import ChangeTracker
from ipvsproxy.daemon.runner import SyncRunner
from ipvsproxy.dataplane.dataplane import SyncResult

START = 1000.0


class FakeClock:
    """Simulated monotonic time; scheduled actions run when a wait reaches their time."""

    def __init__(self, start: float = START) -> None:
        self.now = start
        self._events: list[tuple[float, int, Callable[[], object]]] = []
        self._order = itertools.count()

    def at(self, when: float, action: Callable[[], object]) -> None:
        heapq.heappush(self._events, (when, next(self._order), action))

    def monotonic(self) -> float:
        return self.now

    def _next_by(self, end: float) -> bool:
        """Run the next action due by ``end``, the time advanced to it; False: none is."""
        if not self._events or self._events[0][0] > end:
            return False
        when, _, action = heapq.heappop(self._events)
        self.now = max(self.now, when)
        action()
        return True

    def wait(self, cond: threading.Condition, timeout: float) -> None:
        """As Condition.wait: woken by the first action (it may notify), else timed out."""
        assert timeout < 10**6, "the runner waits forever"
        end = self.now + timeout
        if not self._next_by(end):
            self.now = end

    def sleep(self, stop: threading.Event, seconds: float) -> bool:
        end = self.now + seconds
        while not stop.is_set() and self._next_by(end):
            pass
        if not stop.is_set():
            self.now = end
        return stop.is_set()


Outcome = SyncResult | Exception | Callable[[], SyncResult]


class Harness:
    """A runner over a real ChangeTracker, with syncs that record when they ran (seconds after
    the start) and what they took. ``outcomes`` scripts the syncs' results in turn (an
    exception is raised, a callable called); once they are used up, every sync runs to its
    end."""

    def __init__(
        self, sync_period: float = 3600.0, min_sync_period: float = 0.0, start: float = START
    ) -> None:
        self.start = start
        self.clock = FakeClock(start)
        self.changes = ChangeTracker()
        self.stop = threading.Event()
        self.syncs: list[tuple[float, str, list[str]]] = []  # (time, kind, services taken)
        self.outcomes: list[Outcome] = []
        self.retry_due: float | None = None  # the dataplane's next retry of a failed Service
        self.exceptions: list[Exception] = []
        self.runner = SyncRunner(
            self.changes,
            sync_period=sync_period,
            min_sync_period=min_sync_period,
            reconcile=lambda: self._sync("full"),
            apply_changes=lambda: self._sync("changes"),
            next_retry=lambda: self.retry_due,
            stop=self.stop,
            on_exception=self.exceptions.append,
            clock=self.clock,
        )

    def _sync(self, kind: str) -> SyncResult:
        self.syncs.append((self.clock.now - self.start, kind, sorted(self.changes.take())))
        assert len(self.syncs) < 1000, "the runner syncs without pause"
        if not self.outcomes:
            return SyncResult(full=kind == "full")
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome if isinstance(outcome, SyncResult) else outcome()

    def change(self, after: float, *services: str) -> None:
        """Mark ``services`` ``after`` seconds from the start."""
        for service in services:
            self.clock.at(self.start + after, functools.partial(self.changes.mark, service))

    def run_until(self, after: float) -> list[tuple[float, str, list[str]]]:
        """Run the runner until ``after`` seconds from the start; the syncs it ran."""
        self.clock.at(self.start + after, self.stop.set)
        self.runner.loop()
        return self.syncs


def test_the_first_full_sync_runs_at_once_on_a_freshly_booted_node() -> None:
    """The monotonic clock starts near 0 at boot: a long sync period must not delay the first
    sync of a node that booted a moment ago."""
    h = Harness(sync_period=3600.0, start=5.0)  # 5 s uptime
    assert h.run_until(1) == [(0, "full", [])]


def test_a_full_reconcile_runs_every_sync_period_without_changes() -> None:
    h = Harness(sync_period=30.0)
    assert h.run_until(100) == [
        (0, "full", []),
        (30, "full", []),
        (60, "full", []),
        (90, "full", []),
    ]


def test_changes_wait_for_the_min_sync_period_after_the_sync_before() -> None:
    h = Harness(min_sync_period=10.0)
    h.change(3, "default/a")  # 3 s after the first full sync: applied 10 s after it
    h.change(12, "default/b")  # 2 s after that one: applied at 20
    h.change(35, "default/c")  # long after: applied at once
    assert h.run_until(100) == [
        (0, "full", []),
        (10, "changes", ["default/a"]),
        (20, "changes", ["default/b"]),
        (35, "changes", ["default/c"]),
    ]


def test_a_burst_of_changes_is_coalesced_into_one_sync() -> None:
    h = Harness(min_sync_period=10.0)
    h.change(1, "default/a")
    h.change(2, "default/b", "default/c")
    h.change(4.5, "default/a", "default/d")  # a again: still one mark
    assert h.run_until(100) == [
        (0, "full", []),
        (10, "changes", ["default/a", "default/b", "default/c", "default/d"]),
    ]


def test_a_change_during_a_sync_is_applied_after_the_min_sync_period() -> None:
    h = Harness(min_sync_period=10.0)

    def full_while_a_change_arrives() -> SyncResult:
        h.changes.mark("default/a")  # after the sync took the marks
        return SyncResult(full=True)

    h.outcomes = [full_while_a_change_arrives]
    assert h.run_until(100) == [(0, "full", []), (10, "changes", ["default/a"])]


def test_changes_before_a_full_sync_is_due_are_applied_incrementally() -> None:
    h = Harness(sync_period=30.0, min_sync_period=1.0)
    h.change(29.5, "default/a")
    assert h.run_until(45) == [(0, "full", []), (29.5, "changes", ["default/a"]), (30, "full", [])]


def _failing_one_service(h: Harness, retry_after: float) -> list[Outcome]:
    """A full sync in which one Service fails, due for its retry ``retry_after`` seconds
    later, and the sync that retries it (successfully)."""

    def failed() -> SyncResult:
        h.retry_due = h.clock.now + retry_after
        return SyncResult(full=True, failed={"default/bad": "refused"})

    def retried() -> SyncResult:
        h.retry_due = None
        return SyncResult(full=False)

    return [failed, retried]


def test_a_failed_service_is_retried_at_its_due_time() -> None:
    h = Harness(min_sync_period=1.0)
    h.outcomes = _failing_one_service(h, retry_after=42.5)
    assert h.run_until(100) == [(0, "full", []), (42.5, "changes", [])]


def test_a_retry_due_within_the_min_sync_period_waits_for_it() -> None:
    h = Harness(min_sync_period=10.0)
    h.outcomes = _failing_one_service(h, retry_after=3.0)
    assert h.run_until(100) == [(0, "full", []), (10, "changes", [])]


def test_a_sync_that_raised_is_tried_again_after_a_doubling_backoff() -> None:
    h = Harness(min_sync_period=0.0)
    h.change(1, "default/a")
    h.outcomes = [SyncResult(full=True), *[KeyError("a bug")] * 10]
    syncs = h.run_until(200)
    # 1 s, doubled at each failure up to 30 s; the 11th try runs to its end.
    assert [when for when, _, _ in syncs] == [0, 1, 2, 4, 8, 16, 32, 62, 92, 122, 152, 182]
    assert [kind for _, kind, _ in syncs[1:]] == ["changes"] * 11  # the backoff's tries: no full
    assert len(h.exceptions) == 10 and all(isinstance(e, KeyError) for e in h.exceptions)


def test_a_sync_that_ran_to_its_end_ends_the_backoff() -> None:
    h = Harness(min_sync_period=0.0)
    h.change(1, "default/a")
    h.change(20, "default/b")
    h.outcomes = [SyncResult(full=True), KeyError("a bug"), KeyError("a bug")]
    assert h.run_until(100) == [
        (0, "full", []),
        (1, "changes", ["default/a"]),
        (2, "changes", []),  # 1 s after the first failure
        (4, "changes", []),  # 2 s after the second; runs to its end
        (20, "changes", ["default/b"]),  # at once: no backoff left
    ]


def test_a_full_sync_whose_rules_were_not_written_is_followed_by_one_after_the_backoff() -> None:
    h = Harness(min_sync_period=0.0)
    h.outcomes = [SyncResult(full=True, complete=False)]
    assert h.run_until(100) == [(0, "full", []), (1, "changes", [])]
    assert h.exceptions == []


def test_a_stop_during_the_min_sync_pause_ends_the_runner_without_a_sync() -> None:
    h = Harness(min_sync_period=10.0)
    h.change(3, "default/a")
    assert h.run_until(5) == [(0, "full", [])]
    assert h.changes.pending() == 1


@pytest.mark.parametrize("ready_after", [0, 3])
def test_the_runner_waits_for_the_initial_lists(ready_after: int) -> None:
    h = Harness()
    asked: list[float] = []

    def ready() -> bool:
        asked.append(h.clock.now)
        return len(asked) > ready_after

    assert h.runner.wait_until(ready, poll=0.1)
    assert len(asked) == ready_after + 1
    assert h.clock.now == pytest.approx(START + 0.1 * ready_after)


def test_a_stop_ends_the_wait_for_the_initial_lists() -> None:
    h = Harness()
    h.clock.at(START + 1, h.stop.set)
    assert not h.runner.wait_until(lambda: False, poll=0.1)
    assert h.syncs == []


def test_a_requested_sync_runs_without_a_mark() -> None:
    """An address notice asks for a sync (which re-reads the node's addresses) without marking
    any Service: it runs after the min sync period, and only once for a burst of requests."""
    h = Harness(min_sync_period=10.0)
    for after in (3, 4, 5):
        h.clock.at(h.start + after, h.changes.request_sync)
    assert h.run_until(100) == [(0, "full", []), (10, "changes", [])]
