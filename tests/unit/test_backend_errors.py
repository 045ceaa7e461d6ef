"""Settling a batch's outcomes: every write counted, only the rejected ones described."""

from __future__ import annotations

import errno

import pytest

from ipvsproxy.kernel.errors import ApplyError, Counters, Result, settle, settle_batch


def test_an_accepted_batch_is_counted_and_never_described() -> None:
    counters = Counters()
    described: list[int] = []

    def describe(i: int) -> str:
        described.append(i)
        return f"op {i}"

    kinds = ["add_dest", "add_dest", "add_service"]
    assert settle_batch(kinds, [0, 0, 0], describe, counters) == 3
    assert counters.ok == {"add_dest": 2, "add_service": 1}
    assert counters.failed == {}
    assert described == []
    assert counters.writes == 3


def test_rejected_operations_are_named_with_their_positions() -> None:
    counters = Counters()
    kinds = ["add_service", "add_dest", "add_dest", "delete_dest"]
    errnos = [0, errno.EEXIST, 0, errno.ENOENT]
    with pytest.raises(ApplyError) as exc:
        settle_batch(kinds, errnos, lambda i: f"op {i}", counters)
    err = exc.value
    assert err.applied == 2
    assert err.failed == {1, 3}
    assert [(r.what, r.errno) for r in err.rejected] == [
        ("op 1", errno.EEXIST),
        ("op 3", errno.ENOENT),
    ]
    assert "2 operations rejected, 2 applied" in str(err)
    assert "op 1: File exists" in str(err)
    assert counters.ok == {"add_service": 1, "add_dest": 1}
    assert counters.failed == {"add_dest": 1, "delete_dest": 1}


def test_settle_of_results_is_the_same() -> None:
    counters = Counters()
    results = [Result("set", "create ipset A", 0), Result("set", "create ipset B", errno.EPERM)]
    with pytest.raises(ApplyError) as exc:
        settle(results, counters)
    assert [r.what for r in exc.value.rejected] == ["create ipset B"]
    assert counters.ok == {"set": 1} and counters.failed == {"set": 1}
