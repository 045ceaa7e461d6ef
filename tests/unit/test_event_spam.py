"""Warning Events are limited per object and reason as client-go's spam filter limits them
(tools/record/events_cache.go: a token bucket per source and object, in an LRU of bounded
size), and a user's value goes into a note or a status reason only as a short prefix: one
user's edits can neither storm the API server with Events nor grow the proxy's memory."""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.config import build
from ipvsproxy.core.service_ports import SCHEDULER_ANNOTATION, SHOWN
from ipvsproxy.daemon.proxy import Proxy
from ipvsproxy.kube.events import BURST, CACHE_SIZE, REFILL, EventRecorder
from ipvsproxy.servers.metrics import Metrics
from tests.unit.fake_node import node
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

HUGE = 256 * 1024  # an annotation's value may be this long


class Posts:
    """The API server's side: counts the Events posted, keeps their notes' lengths."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, _ns: str, body: dict[str, Any]) -> None:
        self.bodies.append({"regarding": body["regarding"]["name"], "note": len(body["note"])})


def _recorder(now: list[float]) -> tuple[EventRecorder, Posts]:
    posts = Posts()
    return EventRecorder(posts, "node-1", clock=lambda: now[0]), posts


def _posted(rec: EventRecorder, posts: Posts) -> int:
    rec.queue.join()
    rec.close()
    return len(posts.bodies)


def test_an_object_gets_a_burst_of_events_per_reason_then_one_per_refill() -> None:
    now = [0.0]
    rec, posts = _recorder(now)
    sent = [rec.warn("default/web", "InvalidService", f"value {i}") for i in range(1000)]
    assert sum(sent) == BURST and all(sent[:BURST])
    assert rec.warn("default/web", "FailedToProgram", "another reason: a bucket of its own")
    assert rec.warn("default/other", "InvalidService", "value 0")  # another object's
    now[0] = REFILL
    assert rec.warn("default/web", "InvalidService", "value 1000")
    assert not rec.warn("default/web", "InvalidService", "value 1001")
    assert _posted(rec, posts) == BURST + 3


def test_a_repeated_note_is_posted_once_per_interval_and_takes_no_token() -> None:
    now = [0.0]
    rec, posts = _recorder(now)
    assert [rec.warn("default/web", "InvalidService", "same") for _ in range(100)] == [True] + [
        False
    ] * 99
    now[0] = rec.interval
    assert rec.warn("default/web", "InvalidService", "same")
    # The repeats took no token: the rest of the burst (the interval refilled one) is there
    # for other notes.
    taken = 2 - rec.interval / REFILL
    left = [rec.warn("default/web", "InvalidService", f"v{i}") for i in range(100)]
    assert sum(left) == BURST - taken
    assert _posted(rec, posts) == 2 + BURST - taken


def test_the_recorder_keeps_a_bounded_record_whatever_the_notes() -> None:
    now = [0.0]
    rec, posts = _recorder(now)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1000):
            note = f"{i} " + "x" * HUGE
            rec.warn(f"default/s{i}", "InvalidService", note)
            del note
        for i in range(2 * CACHE_SIZE):
            rec.warn(f"default/t{i}", "InvalidService", "bad")
        rec.queue.join()
        posts.bodies.clear()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    rec.close()
    assert len(rec.records) <= CACHE_SIZE
    assert grown < 2 * 1024 * 1024, f"{grown} bytes kept"


def test_edits_with_huge_invalid_values_post_few_short_events(tmp_path: Path) -> None:
    """1,000 edits of one Service, each with a new invalid scheduler of 256 KiB, each synced:
    a bounded number of Events, each note and the status reason quoting a short prefix of the
    value, and the proxy's memory does not grow with the edits."""
    h = node(tmp_path)
    proxy: Any = Proxy(build(None, []), h.dp, Metrics())
    now = [0.0]
    proxy.events, posts = _recorder(now)
    sl = endpoint_slice("web", [endpoint("10.244.1.5")])
    proxy.on_slice("default/web-abc", None, sl)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1000):
            svc = service("web", "10.96.0.10")
            svc["metadata"]["annotations"] = {SCHEDULER_ANNOTATION: f"{i}-" + "x" * HUGE}
            proxy.on_service("default/web", None, svc)
            del svc
            proxy.apply_changes()
            now[0] += 1.0
        proxy.events.queue.join()
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert _posted(proxy.events, posts) <= BURST + 1000 / REFILL + 1
    assert max(b["note"] for b in posts.bodies) < SHOWN + 200
    reason = proxy.status_document()["invalidServices"]["default/web"]
    assert "999-xxx" in reason and len(reason) < SHOWN + 200
    # What stays: the Service as last seen (one value), nothing per edit.
    assert grown < HUGE + 2 * 1024 * 1024, f"{grown} bytes kept"


def test_an_unexpected_planner_exception_is_quoted_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the planner raises may quote a user's value (Python's own messages quote up to
    200 characters, a KeyError all of its key): the Service's error keeps a short prefix."""
    from ipvsproxy.dataplane import dataplane

    def raising(*_a: Any) -> Any:
        raise KeyError("k" * HUGE)

    monkeypatch.setattr(dataplane, "plan_service", raising)
    h = node(tmp_path)
    error = h.dp.update_service("default/web", service("web", "10.96.0.10"), [])
    assert error is not None and error.startswith("cannot plan: KeyError: ")
    assert len(error) < 4 * SHOWN + 100


def test_a_note_is_cut_to_the_apis_limit_in_bytes() -> None:
    """events.k8s.io refuses a note of more than 1,024 bytes (not characters)."""
    now = [0.0]
    rec, _posts = _recorder(now)
    bodies: list[dict[str, Any]] = []
    rec.post = lambda _ns, body: bodies.append(body)
    assert rec.warn("default/web", "InvalidService", "é" * 2000)
    _posted(rec, _posts)
    assert len(bodies[0]["note"].encode()) <= 1024
