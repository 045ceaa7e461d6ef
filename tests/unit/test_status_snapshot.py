"""/status and /status/all are built from a copy of the last sync's state, never under the
sync lock: a local client cannot slow syncs, and an answer never shows a half-applied sync."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.status import view
from tests.unit.fake_node import Node, running_node
from tests.unit.test_proxy_health import _add, _proxy

BOUND = 10.0  # a failure bound, not a speed requirement


@pytest.fixture
def h(tmp_path: Path) -> Node:
    return running_node(tmp_path)


def _vips(doc: dict[str, Any]) -> set[str]:
    return {vs[0] for vs in doc["desired"]}


@pytest.mark.parametrize("kernel", [False, True], ids=["/status", "/status/all"])
def test_a_sync_proceeds_while_a_status_answer_is_being_built(
    h: Node, monkeypatch: pytest.MonkeyPatch, kernel: bool
) -> None:
    proxy = _proxy(h)
    _add(proxy, "web", "10.96.0.10")
    proxy.apply_changes()
    building, release = threading.Event(), threading.Event()
    build = view.daemon_document

    def held(*args: Any, **kwargs: Any) -> dict[str, Any]:
        building.set()
        release.wait(BOUND)
        return build(*args, **kwargs)

    monkeypatch.setattr(view, "daemon_document", held)
    answers: list[dict[str, Any]] = []
    request = threading.Thread(target=lambda: answers.append(proxy.status_document(kernel)))
    request.start()
    try:
        assert building.wait(BOUND)
        _add(proxy, "web2", "10.96.0.11")
        sync = threading.Thread(target=proxy.apply_changes)
        sync.start()
        sync.join(BOUND)
        assert not sync.is_alive(), "the sync waited for the status answer"
    finally:
        release.set()
        request.join(BOUND)
    monkeypatch.setattr(view, "daemon_document", build)
    # The answer in flight shows the sync before; the next one the sync that ran meanwhile.
    assert "10.96.0.10" in _vips(answers[0]) and "10.96.0.11" not in _vips(answers[0])
    assert {"10.96.0.10", "10.96.0.11"} <= _vips(proxy.status_document(kernel))


def test_syncs_copy_the_status_only_when_it_is_asked_for(
    h: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy costs in proportion to the cluster (3 of an incremental sync's 9 ms at 5,000
    Services on the fakes): syncs nobody asks the status of take none, and the answers after
    one sync share one copy."""
    proxy = _proxy(h)
    copies: list[int] = []
    take = proxy._copy_status

    def counted() -> Any:
        copies.append(1)
        return take()

    monkeypatch.setattr(proxy, "_copy_status", counted)
    for i in range(3):
        _add(proxy, f"web{i}", f"10.96.0.{10 + i}")
        proxy.apply_changes()
    assert copies == []
    assert {"10.96.0.10", "10.96.0.12"} <= _vips(proxy.status_document())
    proxy.status_document(kernel=True)
    proxy.port_names()
    assert len(copies) == 1
    _add(proxy, "web3", "10.96.0.13")
    proxy.apply_changes()
    assert "10.96.0.13" in _vips(proxy.status_document())
    assert len(copies) == 2


def test_an_answer_during_a_sync_is_the_last_syncs_and_does_not_wait(h: Node) -> None:
    """A request that finds a sync running (the lock held) answers with the copy of the sync
    before, at once."""
    proxy = _proxy(h)
    _add(proxy, "web", "10.96.0.10")
    proxy.apply_changes()
    assert "10.96.0.10" in _vips(proxy.status_document())
    _add(proxy, "web2", "10.96.0.11")
    proxy.apply_changes()
    with proxy.sync_lock:  # a sync in progress
        doc = proxy.status_document()
    assert "10.96.0.10" in _vips(doc)
    assert {"10.96.0.10", "10.96.0.11"} <= _vips(proxy.status_document())
