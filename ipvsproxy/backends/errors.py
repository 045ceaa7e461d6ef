"""Errors that name the object the kernel refused, so nothing fails silently in a batch."""

from __future__ import annotations

import os
from dataclasses import dataclass


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
