"""Informers against the lab API server with the official client: paging, watch events, and a
410 after a compaction that relists and reports only what differs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from ipvsproxy.watch import Informer, Kept
from lab.apiserver import APIServer


@pytest.fixture
def core(tmp_path: Path) -> Iterator[tuple[APIServer, Any]]:
    with APIServer(bookmark_interval=0.5) as srv:
        new_client: Any = config.new_client_from_config
        yield srv, client.CoreV1Api(new_client(str(srv.write_kubeconfig(tmp_path / "kc"))))


def svc(name: str, port: int = 80) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"ports": [{"port": port}]}}


def wait(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def start(
    api: Any, events: list[tuple[str, Kept | None, Kept | None]]
) -> tuple[Informer, threading.Event]:
    stop = threading.Event()
    inf = Informer(
        "services",
        api.list_service_for_all_namespaces,
        lambda k, o, n: events.append((k, o, n)),
        stop=stop,
        page_size=2,
        watch_timeout=2,
    )
    threading.Thread(target=inf.run, daemon=True).start()
    return inf, stop


def test_pages_then_watches_then_relists_after_410(core: tuple[APIServer, Any]) -> None:
    srv, api = core
    for i in range(5):
        api.create_namespaced_service("default", svc(f"s{i}"))
    events: list[tuple[str, Kept | None, Kept | None]] = []
    inf, stop = start(api, events)
    try:
        wait(inf.synced.is_set)
        assert sorted(k for k, o, n in events if o is None) == [f"default/s{i}" for i in range(5)]
        assert inf.counters.lists == 1
        # Watch: an update and a delete arrive in order.
        events.clear()
        api.patch_namespaced_service("s1", "default", {"metadata": {"labels": {"x": "y"}}})
        api.delete_namespaced_service("s2", "default")
        wait(lambda: len(events) >= 2)
        assert [(k, o is not None, n is not None) for k, o, n in events] == [
            ("default/s1", True, True),
            ("default/s2", True, False),
        ]
        # The watch ends (timeoutSeconds) and resumes from the last resourceVersion: a change
        # made while no watch is open is not missed.
        wait(lambda: inf.counters.watches >= 2, 10)
        # A change and a compaction while the server is down: the informer relists (its watch
        # was cut, or it resumes into 410 Gone), and the relist reports only the Service that
        # changed, not every object again.
        events.clear()
        srv.stop()
        from lab.apiserver.resources import lookup

        body = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "new", "namespace": "default"},
            "spec": {"ports": [{"port": 81}]},
        }
        srv.ops.create(lookup("", "v1", "services"), "default", body)  # type: ignore[arg-type]
        srv.compact()
        time.sleep(3)
        srv.start()
        wait(lambda: inf.counters.lists >= 2, 30)
        wait(lambda: any(k == "default/new" for k, _, _ in events), 10)
        assert [k for k, _, _ in events] == ["default/new"]
        assert set(inf.cache) == {
            "default/s0",
            "default/s1",
            "default/s3",
            "default/s4",
            "default/new",
        }
    finally:
        stop.set()


def test_a_watch_from_a_compacted_resource_version_relists(core: tuple[APIServer, Any]) -> None:
    """The lab server's 410 (an ERROR event, as the real one sends): the watch ends asking for
    a relist, which asks for data no older than what was seen and reports only the change."""
    srv, api = core
    api.create_namespaced_service("default", svc("old"))
    events: list[tuple[str, Kept | None, Kept | None]] = []
    inf = Informer(
        "services",
        api.list_service_for_all_namespaces,
        lambda k, o, n: events.append((k, o, n)),
        stop=threading.Event(),
    )
    inf.relist()
    seen = inf.resource_version
    api.create_namespaced_service("default", svc("new"))
    srv.compact()
    events.clear()
    assert inf.watch_once() is False
    assert inf.counters.relists_after_gone == 1
    assert inf.resource_version == seen
    inf.relist()
    assert [k for k, _, _ in events] == ["default/new"]
    assert set(inf.cache) == {"default/old", "default/new"}
