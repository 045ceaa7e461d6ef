"""Outcomes of writes: counted by kind, and errors that name the object the kernel refused, so
nothing fails silently in a batch."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Rejected:
    """One operation the kernel rejected."""

    what: str  # the operation, e.g. "add real server 10.244.1.5:8080 of TCP 10.96.0.10:80"
    errno: int

    def __str__(self) -> str:
        if self.errno > 4096:  # ipset's own codes; the text is in ``what``
            return f"{self.what} (error {self.errno})"
        return f"{self.what}: {os.strerror(self.errno)} (errno {self.errno})"


class ApplyError(RuntimeError):
    """Some operations of a batch were rejected; the others were applied."""

    def __init__(
        self, rejected: list[Rejected], applied: int, failed: frozenset[int] = frozenset()
    ) -> None:
        self.rejected = rejected
        self.applied = applied
        self.failed = failed  # positions, in the batch, of the rejected operations
        shown = "; ".join(str(r) for r in rejected[:5])
        more = f" (and {len(rejected) - 5} more)" if len(rejected) > 5 else ""
        super().__init__(f"{len(rejected)} operations rejected, {applied} applied: {shown}{more}")


@dataclass
class Counters:
    """Write operations by kind and outcome, for metrics and for tests that count them."""

    ok: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)

    def count(self, kind: str, ok: bool) -> None:
        bucket = self.ok if ok else self.failed
        bucket[kind] = bucket.get(kind, 0) + 1

    @property
    def writes(self) -> int:
        return sum(self.ok.values()) + sum(self.failed.values())


@dataclass(frozen=True, slots=True)
class Result:
    """One write's outcome: ``errno`` 0 for success."""

    kind: str  # counter name, e.g. "add_dest"
    what: str  # the operation, for the error message
    errno: int


def settle(results: Sequence[Result], counters: Counters) -> int:
    """Count every outcome; raise ApplyError naming the rejected ones, else return the count."""
    return settle_batch(
        [r.kind for r in results], [r.errno for r in results], lambda i: results[i].what, counters
    )


def settle_batch(
    kinds: Sequence[str], errnos: Sequence[int], describe: Callable[[int], str], counters: Counters
) -> int:
    """``settle`` for a batch of thousands: operation ``i`` is described (``describe(i)``)
    only if it was rejected, as naming an operation costs more than encoding it."""
    if not any(errnos):  # every one applied: counted by kind in C, not one by one
        ok = counters.ok
        for kind, n in Counter(kinds).items():
            ok[kind] = ok.get(kind, 0) + n
        return len(kinds)
    failed = [i for i, e in enumerate(errnos) if e]
    for kind, errno in zip(kinds, errnos, strict=True):
        counters.count(kind, errno == 0)
    rejected = [Rejected(describe(i), errnos[i]) for i in failed]
    raise ApplyError(rejected, len(kinds) - len(failed), frozenset(failed))
