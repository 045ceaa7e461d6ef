"""Watch streams: which changes a watcher sees, as what event type, and when bookmarks go out.

Selectors are applied to both the old and the new state of every change, as the real watch
cache does: an object that stops matching is sent as DELETED (its last matching state, at the
change's resourceVersion) and one that starts matching as ADDED. So a selector-filtered watch
can maintain exactly the set a selector-filtered list would return.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from lab.apiserver import errors
from lab.apiserver.listing import TOO_LARGE_WAIT, Filter, parse_rv
from lab.apiserver.meta import JSON
from lab.apiserver.store import DELETED, Bookmark, Change, Closed, Compacted, Store, Watcher

# How often an idle stream checks that its client is still there.
POLL_INTERVAL = 0.25
# Without timeoutSeconds the real server picks a timeout in [min-request-timeout, 2x that).
MIN_REQUEST_TIMEOUT = 1800.0
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class EventSink(Protocol):
    def send(self, event: JSON) -> None:
        """Write one event; raises OSError once the client has gone."""

    def alive(self) -> bool: ...


@dataclass(frozen=True)
class WatchRequest:
    flt: Filter
    since: int | None
    initial: bool
    initial_end: bool
    bookmarks: bool
    timeout: float


def _flag(params: Mapping[str, str], name: str) -> bool:
    return params.get(name, "").lower() in ("true", "1")


def _timeout(text: str) -> float:
    """timeoutSeconds, where 0 (or absent) means the server's own randomized default."""
    try:
        seconds = int(text)
    except ValueError as exc:
        raise errors.bad_request(f"invalid timeoutSeconds {text!r}") from exc
    return float(seconds) if seconds > 0 else MIN_REQUEST_TIMEOUT * (1 + random.random())


def parse_request(store: Store, flt: Filter, params: Mapping[str, str]) -> WatchRequest:
    text = params.get("resourceVersion") or ""
    bookmarks = _flag(params, "allowWatchBookmarks")
    initial_end = _flag(params, "sendInitialEvents")
    if initial_end and params.get("resourceVersionMatch") != "NotOlderThan":
        detail = (
            "sendInitialEvents is forbidden for watch unless resourceVersionMatch is set to "
            "NotOlderThan"
        )
        raise errors.invalid_object(
            "ListOptions", "meta.k8s.io", "", [errors.forbidden("sendInitialEvents", detail)]
        )
    if initial_end and not bookmarks:
        detail = "allowWatchBookmarks must be set to true when sendInitialEvents is true"
        raise errors.invalid_object(
            "ListOptions", "meta.k8s.io", "", [errors.forbidden("allowWatchBookmarks", detail)]
        )
    since: int | None = None
    if text not in ("", "0"):
        since = parse_rv(text)
        if not store.wait_for(since, TOO_LARGE_WAIT):
            raise errors.too_large_resource_version(since, store.rv)
    timeout = _timeout(params.get("timeoutSeconds") or "0")
    initial = since is None or initial_end
    if initial_end:
        since = None
    return WatchRequest(flt, since, initial, initial_end, bookmarks, timeout)


def to_event(flt: Filter, change: Change) -> JSON | None:
    """The event this watcher gets for a change, if any (cacheWatcher.convertToWatchEvent)."""
    now = change.type != DELETED and flt.matches(change.key, change.obj)
    before = change.prev is not None and flt.matches(change.key, change.prev)
    if now:
        kind = "MODIFIED" if before else "ADDED"
        return {"type": kind, "object": flt.rt.present(change.obj)}
    if not before:
        return None
    gone = change.obj if change.type == DELETED else change.prev
    assert gone is not None
    obj = flt.rt.present(gone)
    obj["metadata"] = {**obj.get("metadata", {}), "resourceVersion": str(change.rv)}
    return {"type": "DELETED", "object": obj}


def bookmark_event(flt: Filter, mark: Bookmark) -> JSON:
    md: JSON = {"resourceVersion": str(mark.rv)}
    if mark.initial_events_end:
        md["annotations"] = {INITIAL_EVENTS_END: "true"}
    return {
        "type": "BOOKMARK",
        "object": {"kind": flt.rt.kind, "apiVersion": flt.rt.api_version, "metadata": md},
    }


def error_event(err: errors.APIError) -> JSON:
    return {"type": "ERROR", "object": err.status()}


def open_watcher(store: Store, req: WatchRequest) -> Watcher:
    """Register; a resourceVersion older than the compaction raises APIError 410."""
    try:
        return store.watch(req.flt.rt.storage, req.since, req.initial, req.initial_end)
    except Compacted as exc:
        raise errors.too_old_watch(exc.requested, exc.compacted) from exc


def serve(
    store: Store, watcher: Watcher, req: WatchRequest, sink: EventSink, bookmark_interval: float
) -> None:
    """Send events until timeoutSeconds (closing with a bookmark when those were asked for),
    server shutdown, or the client going away."""
    start = time.monotonic()
    deadline = start + req.timeout
    next_mark = start + bookmark_interval if req.bookmarks else math.inf
    finishing = False
    try:
        while True:
            now = time.monotonic()
            if not finishing and now >= deadline:
                if not req.bookmarks:
                    return
                store.bookmark(watcher)
                finishing = True
            elif req.bookmarks and not finishing and now >= next_mark:
                store.bookmark(watcher)
                next_mark = now + bookmark_interval
            wake = (
                min(deadline, next_mark, now + POLL_INTERVAL)
                if not finishing
                else now + POLL_INTERVAL
            )
            item = watcher.get(wake - now)
            if item is None:
                if not sink.alive():
                    return
                continue
            if isinstance(item, Closed):
                return
            if isinstance(item, Bookmark):
                sink.send(bookmark_event(req.flt, item))
                if finishing:
                    return
                continue
            event = to_event(req.flt, item)
            if event is not None:
                sink.send(event)
    finally:
        store.unwatch(watcher)
