"""/status and /status/all are built from a copy taken at the end of each sync, never under the
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
