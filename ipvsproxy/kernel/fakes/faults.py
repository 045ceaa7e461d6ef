"""What every fake can be told to get wrong: refuse operations, raise from methods."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from ipvsproxy.kernel.errors import Counters

Op = TypeVar("Op")


def _every(_op: object) -> bool:
    return True


def _any_call(*_args: object) -> bool:
    return True


@dataclass
class Refusal(Generic[Op]):
    """Refuse the ``nth`` operation ``where`` matches, and ``times - 1`` more after it (None:
    every later one), with ``errno``."""

    errno: int
    where: Callable[[Op], bool] = _every
    nth: int = 1
    times: int | None = 1
    matched: int = 0
    refused: int = 0

    def takes(self, op: Op) -> bool:
        if not self.where(op):
            return False
        self.matched += 1
        if self.matched < self.nth or (self.times is not None and self.refused >= self.times):
            return False
        self.refused += 1
        return True


@dataclass
class Raising:
    """Raise ``exc`` from the next ``times`` calls (None: every one) of ``method`` whose
    arguments ``where`` matches."""

    method: str
    exc: BaseException
    where: Callable[..., bool] = _any_call
    times: int | None = 1
    raised: int = 0


class FakeBackend(Generic[Op]):
    """What every fake has: its counters and calls, and what it is told to get wrong."""

    def __init__(self) -> None:
        self.counters = Counters()
        self.calls: Counter[str] = Counter()
        self.refusals: list[Refusal[Op]] = []
        self.raisings: list[Raising] = []

    def refuse(
        self,
        errno: int,
        where: Callable[[Op], bool] = _every,
        nth: int = 1,
        times: int | None = 1,
    ) -> Refusal[Op]:
        """Refuse an operation the kernel would take (see ``Refusal``); the first refusal
        told that takes an operation refuses it."""
        refusal = Refusal(errno, where, nth, times)
        self.refusals.append(refusal)
        return refusal

    def raise_from(
        self,
        method: str,
        exc: BaseException,
        where: Callable[..., bool] = _any_call,
        times: int | None = 1,
    ) -> Raising:
        if not callable(getattr(type(self), method, None)):
            raise ValueError(f"{type(self).__name__} has no method {method!r}")
        raising = Raising(method, exc, where, times)
        self.raisings.append(raising)
        return raising

    def on_call(self, method: str, *args: object) -> None:
        """What each method does first: count the call, raise what it was told to."""
        self.calls[method] += 1
        for r in self.raisings:
            if r.method == method and (r.times is None or r.raised < r.times) and r.where(*args):
                r.raised += 1
                raise r.exc

    def _refused(self, op: Op) -> int:
        for refusal in self.refusals:
            if refusal.takes(op):
                return refusal.errno
        return 0
