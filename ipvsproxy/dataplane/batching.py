"""Applying operations in chunks, and isolating what fails.

A full sync holds one chunk's operations, their encoded requests and their outcomes at a time.
A chunk the kernel partly refused does not stop the chunks after it; a chunk that raised is
applied again one item at a time, so only the items that raise again are blamed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeVar

from ipvsproxy.kernel.errors import ApplyError, Rejected

_T = TypeVar("_T")
_C = TypeVar("_C")

# A full sync converges this many virtual servers (or ipset members) at a time: their
# operations, encoded requests and outcomes are all that it holds of them at once.
CHUNK_VIRTUAL_SERVERS = 512
CHUNK_MEMBERS = 4096


def chunked(items: Sequence[_T], size: int) -> Iterator[list[_T]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def apply_chunks(chunks: Iterable[_C], apply: Callable[[_C], int]) -> None:
    """``apply`` each chunk in order (it returns how many operations it applied); a chunk the
    kernel partly rejected does not stop the others: the rejections are raised together at
    the end."""
    rejected: list[Rejected] = []
    applied = 0
    for chunk in chunks:
        try:
            applied += apply(chunk)
        except ApplyError as exc:
            rejected += exc.rejected
            applied += exc.applied
    if rejected:
        raise ApplyError(rejected, applied)


def isolating(
    apply: Callable[[list[_T]], int], blame: Callable[[_T, Exception], None]
) -> Callable[[list[_T]], int]:
    """``apply`` for a chunk; if it raises anything but ApplyError (a codec's struct.error,
    pyroute2's NetlinkError, a bug), each item of the chunk is applied on its own, and those
    that raise again are blamed: only their owners fail, the others are applied."""

    def run(chunk: list[_T]) -> int:
        try:
            return apply(chunk)
        except ApplyError:
            raise
        except Exception as exc:
            if len(chunk) == 1:
                blame(chunk[0], exc)
                return 0
        rejected: list[Rejected] = []
        applied = 0
        for item in chunk:
            try:
                applied += apply([item])
            except ApplyError as exc:
                rejected += exc.rejected
                applied += exc.applied
            except Exception as exc:
                blame(item, exc)
        if rejected:
            raise ApplyError(rejected, applied)
        return applied

    return run


def refusal(exc: ApplyError, ops: Sequence[object], i: int) -> str:
    """The kernel's refusal of ``ops[i]``, by its position among the refused ones."""
    failed = sorted(exc.failed)
    if i in failed and failed.index(i) < len(exc.rejected):
        return str(exc.rejected[failed.index(i)])
    return f"{ops[i]}: refused"


def apply_and_record(
    apply: Callable[[list[_T]], object], ops: list[_T], record: Callable[[list[_T]], None]
) -> None:
    """Apply ``ops`` and record those the kernel accepted, also when some were rejected."""
    try:
        apply(ops)
    except ApplyError as exc:
        record([op for i, op in enumerate(ops) if i not in exc.failed])
        raise
    record(ops)
