"""A handler that raises loses nothing: the object's change is handed to it again later, the
rest of a relist or of a watch stream is still delivered, and the failure is logged and
counted. Over an in-process list function (no HTTP) and a fake clock."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from ipvsproxy.config import ProxyConfig
from ipvsproxy.daemon.wiring import informers
from ipvsproxy.kube.informer import RETRY_FIRST, Informer, Kept
from ipvsproxy.servers.metrics import Metrics


def _svc(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "resourceVersion": rv}}


class Stream:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.lines = [json.dumps(e).encode() + b"\n" for e in events]

    def stream(self, amt: Any = None, decode_content: Any = None) -> Iterator[bytes]:
        yield from self.lines

    def release_conn(self) -> None:
        pass


class Server:
    """Lists ``items`` at ``rv``; each watch streams the next of ``watches``."""

    def __init__(self, items: list[dict[str, Any]], rv: str = "10") -> None:
        self.items, self.rv = items, rv
        self.watches: list[list[dict[str, Any]]] = []

    def __call__(self, watch: bool = False, **_kw: Any) -> Any:
        if watch:
            return Stream(self.watches.pop(0))
        body = {"metadata": {"resourceVersion": self.rv}, "items": self.items}
        return SimpleNamespace(data=json.dumps(body).encode())


class Handler:
    """Records what it is handed; raises for the keys in ``failing``."""

    def __init__(self) -> None:
        self.failing: set[str] = set()
        self.got: list[tuple[str, str | None, str | None]] = []

    def __call__(self, key: str, old: Kept | None, new: Kept | None) -> None:
        if key in self.failing:
            raise KeyError("a bug")
        self.got.append((key, _rv(old), _rv(new)))


def _rv(obj: Kept | None) -> str | None:
    return None if obj is None else obj["metadata"]["resourceVersion"]


def _informer(server: Server, handler: Handler, now: list[float]) -> tuple[Informer, list[str]]:
    failures: list[str] = []
    inf = Informer(
        "services",
        server,
        handler,
        stop=threading.Event(),
        clock=lambda: now[0],
        on_handler_error=failures.append,
    )
    return inf, failures


def test_a_failing_handler_in_a_relist_loses_neither_its_object_nor_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = Server([_svc("a", "1"), _svc("b", "2"), _svc("c", "3")])
    handler, now = Handler(), [1000.0]
    inf, failures = _informer(server, handler, now)
    handler.failing = {"default/b"}
    with caplog.at_level(logging.ERROR, logger="ipvsproxy.kube.informer"):
        inf.relist()
    assert handler.got == [("default/a", None, "1"), ("default/c", None, "3")]
    assert failures == ["default/b"] and inf.counters.handler_errors == 1
    assert any("default/b" in r.getMessage() and r.exc_info for r in caplog.records)
    assert set(inf.cache) == {"default/a", "default/b", "default/c"}
    # Fixed (or the fault was passing): the next relist, though nothing changed, hands it over.
    handler.failing, handler.got = set(), []
    inf.relist()
    assert handler.got == [("default/b", None, "2")]
    inf.relist()
    assert handler.got == [("default/b", None, "2")]  # once


def test_a_failing_handler_in_a_watch_loses_neither_its_change_nor_the_rest() -> None:
    server = Server([_svc("a", "1"), _svc("b", "2")])
    handler, now = Handler(), [1000.0]
    inf, failures = _informer(server, handler, now)
    inf.relist()
    handler.got = []
    handler.failing = {"default/a"}
    server.watches.append(
        [
            {"type": "MODIFIED", "object": _svc("a", "11")},
            {"type": "ADDED", "object": _svc("c", "12")},
            {"type": "MODIFIED", "object": _svc("a", "13")},  # still failing
            {"type": "DELETED", "object": _svc("b", "14")},
        ]
    )
    assert inf.watch_once()
    assert handler.got == [("default/c", None, "12"), ("default/b", "2", None)]
    assert failures == ["default/a", "default/a"] and inf.resource_version == "14"
    # The handler works again: the change is handed over at the next retry, from what the
    # handler last saw to what the cache holds now, once.
    handler.failing, handler.got = set(), []
    now[0] += RETRY_FIRST
    server.watches.append([{"type": "ADDED", "object": _svc("d", "15")}])
    assert inf.watch_once()
    assert handler.got == [("default/d", None, "15"), ("default/a", "1", "13")]
    now[0] += 60
    server.watches.append([{"type": "MODIFIED", "object": _svc("d", "16")}])
    assert inf.watch_once()
    assert handler.got[2:] == [("default/d", "15", "16")]


def test_a_retry_waits_for_its_delay_and_a_later_event_of_the_object_carries_it() -> None:
    server = Server([_svc("a", "1")])
    handler, now = Handler(), [1000.0]
    inf, failures = _informer(server, handler, now)
    handler.failing = {"default/a"}
    inf.relist()
    server.watches.append([{"type": "ADDED", "object": _svc("x", "11")}])
    assert inf.watch_once()
    assert failures == ["default/a"]  # not retried before its delay
    now[0] += RETRY_FIRST
    server.watches.append([{"type": "ADDED", "object": _svc("y", "12")}])
    assert inf.watch_once()
    assert failures == ["default/a", "default/a"]  # retried, failed again: a longer delay
    handler.failing = set()
    server.watches.append([{"type": "MODIFIED", "object": _svc("a", "13")}])
    assert inf.watch_once()
    assert ("default/a", None, "13") in handler.got  # its own event: from what it last saw


def test_the_daemon_counts_each_handler_failure_by_informer() -> None:
    def raising(*_a: Any) -> None:
        raise KeyError("a bug")

    metrics = Metrics()
    proxy: Any = SimpleNamespace(stop=threading.Event(), metrics=metrics, on_service=raising)
    proxy.on_slice = proxy.on_node = lambda *_a: None
    infs = {i.name: i for i in informers(ProxyConfig(), object(), proxy, "node-1")}
    infs["services"].list_fn = Server([_svc("a", "1"), _svc("b", "2")])
    infs["services"].relist()
    value = metrics.registry.get_sample_value(
        "ipvsproxy_informer_handler_errors_total", {"informer": "services"}
    )
    assert value == 2.0
