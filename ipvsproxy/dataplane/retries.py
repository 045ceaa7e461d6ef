"""Services whose programming failed, each retried on its own, with its own backoff.

An operation the kernel refused, or one that raised, fails the Service that owns the object
(keys no Service owns any more, leftovers of a deleted one, fail under ""). The failed keys are
converged again when that Service's retry is due, 1 s after the first failure, doubling to 30 s,
while every other change applies at the usual pace; a retry that succeeds clears the failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ipvsproxy.core.desired import Changes

RETRY_FIRST = 1.0
RETRY_MAX = 30.0


@dataclass
class Failure:
    reason: str  # the last error, for Events, logs and status
    attempts: int = 0  # syncs in a row that failed this Service
    retry_at: float = 0.0  # clock() of the next retry
    keys: Changes = field(default_factory=Changes)  # what the retry converges again


class Failures:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.by_service: dict[str, Failure] = {}
        self._this_sync: dict[str, str] = {}
        self._retrying: set[str] = set()
        self._taken: dict[str, Changes] = {}  # the retried Services' keys, as ``begin`` took them

    def begin(self, everything: bool = False) -> Changes:
        """A sync starts: the keys of the Services whose retry is due (every failed Service's
        for a full sync, which converges every key anyway)."""
        now = self.clock()
        self._this_sync = {}
        self._retrying = {s for s, f in self.by_service.items() if everything or f.retry_at <= now}
        keys = Changes()
        self._taken = {}
        for service in self._retrying:
            failure = self.by_service[service]
            keys.merge(failure.keys)
            self._taken[service] = failure.keys
            failure.keys = Changes()  # a key that fails again is named again
        return keys

    def fail(self, service: str, reason: str, keys: Changes) -> None:
        """``service``'s ``keys`` could not be converged (counted once a sync)."""
        failure = self.by_service.get(service)
        if failure is None:
            failure = self.by_service[service] = Failure(reason)
        if service not in self._this_sync:
            self._back_off(failure)
        failure.reason = reason
        failure.keys.merge(keys)
        self._this_sync[service] = reason

    def end(self, clear: bool = True) -> dict[str, str]:
        """The sync ended: the Services it retried without a new failure are programmed now
        (unless not ``clear``: the sync could not try them all). Returns the Services that
        failed in this sync, and why."""
        for service in self._retrying - self._this_sync.keys():
            if clear:
                self.by_service.pop(service, None)
                continue
            # Not tried for sure: retried again after its next backoff (not due at once, or
            # the runner syncs without pause while the sync cannot try it), with its keys.
            failure = self.by_service[service]
            failure.keys.merge(self._taken.get(service, Changes()))
            self._back_off(failure, again=False)
        self._retrying, self._taken = set(), {}
        return dict(self._this_sync)

    def _back_off(self, failure: Failure, again: bool = True) -> None:
        """Its next retry, one backoff from now (``again``: after one more failed attempt)."""
        failure.attempts += again
        backoff = RETRY_FIRST * 2 ** min(failure.attempts - 1, 16)
        failure.retry_at = self.clock() + min(RETRY_MAX, backoff)

    def next_retry(self) -> float | None:
        """clock() of the earliest retry due, if any Service failed."""
        return min((f.retry_at for f in self.by_service.values()), default=None)
