"""The object store: every object, the one cluster-wide resourceVersion, history and watchers.

It plays etcd plus the watch cache. Every write takes the next resourceVersion, is appended to
the history and handed to the watchers of its bucket while the lock is held, so a watcher
registered under the same lock sees each change exactly once and in order. The history is what
lets a watch resume from an old resourceVersion and a paged list read later pages from the
snapshot its first page saw; ``compact()`` forgets it, as etcd compaction does, after which
both get 410 Expired.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from dataclasses import dataclass

from lab.apiserver.meta import JSON

Key = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
# A watch cache holds a window of changes; past this many the oldest are compacted away.
HISTORY_LIMIT = 200_000


@dataclass(frozen=True)
class Change:
    """One write. ``prev`` is the object before it (None for a create)."""

    rv: int
    bucket: str
    type: str
    key: Key
    obj: JSON
    prev: JSON | None


@dataclass(frozen=True)
class Bookmark:
    rv: int
    initial_events_end: bool = False


class Closed:
    """Queued when the store shuts down: the watch stream ends."""


WatchItem = Change | Bookmark | Closed


class Compacted(Exception):
    def __init__(self, requested: int, compacted: int) -> None:
        super().__init__(f"resourceVersion {requested} is compacted (at {compacted})")
        self.requested = requested
        self.compacted = compacted


class Watcher:
    """The queue of one watch stream; filled under the store lock, drained by its handler."""

    def __init__(self, bucket: str) -> None:
        self.bucket = bucket
        self._queue: queue.SimpleQueue[WatchItem] = queue.SimpleQueue()

    def push(self, item: WatchItem) -> None:
        self._queue.put(item)

    def get(self, timeout: float) -> WatchItem | None:
        try:
            return self._queue.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None


def _with_rv(obj: JSON, rv: int) -> JSON:
    out = dict(obj)
    out["metadata"] = dict(obj.get("metadata") or {})
    out["metadata"]["resourceVersion"] = str(rv)
    return out


class Store:
    def __init__(self, history_limit: int = HISTORY_LIMIT) -> None:
        self.lock = threading.RLock()
        self._advanced = threading.Condition(self.lock)
        self._rv = 0
        self._compacted = 0
        self._history_limit = history_limit
        self._objects: dict[str, dict[Key, JSON]] = collections.defaultdict(dict)
        self._history: collections.deque[Change] = collections.deque()
        self._watchers: set[Watcher] = set()
        self._closed = False

    @property
    def rv(self) -> int:
        with self.lock:
            return self._rv

    @property
    def compacted(self) -> int:
        with self.lock:
            return self._compacted

    def get(self, bucket: str, key: Key) -> JSON | None:
        with self.lock:
            return self._objects[bucket].get(key)

    def values(self, bucket: str) -> list[JSON]:
        with self.lock:
            return list(self._objects[bucket].values())

    def put(self, bucket: str, key: Key, obj: JSON) -> JSON:
        """Create or replace; the stored object gets the new resourceVersion. ``obj`` is owned
        by the store from here on and must not be changed by the caller."""
        with self.lock:
            prev = self._objects[bucket].get(key)
            stored = _with_rv(obj, self._rv + 1)
            self._objects[bucket][key] = stored
            self._record(bucket, MODIFIED if prev else ADDED, key, stored, prev)
            return stored

    def delete(self, bucket: str, key: Key) -> JSON:
        """Remove; answers the last state stamped with the deletion's resourceVersion, which is
        what both the DELETE response and the DELETED event carry on the real server."""
        with self.lock:
            prev = self._objects[bucket].pop(key)
            gone = _with_rv(prev, self._rv + 1)
            self._record(bucket, DELETED, key, gone, prev)
            return gone

    def _record(self, bucket: str, kind: str, key: Key, obj: JSON, prev: JSON | None) -> None:
        self._rv += 1
        change = Change(self._rv, bucket, kind, key, obj, prev)
        self._history.append(change)
        while len(self._history) > self._history_limit:
            self._compacted = self._history.popleft().rv
        for watcher in self._watchers:
            if watcher.bucket == bucket:
                watcher.push(change)
        self._advanced.notify_all()

    def snapshot(self, bucket: str, at: int | None) -> tuple[int, list[tuple[Key, JSON]]]:
        """The bucket as it was at resourceVersion ``at`` (None: now), in key order, rebuilt by
        undoing the newer changes."""
        with self.lock:
            rv = self._rv if at is None else at
            if rv < self._compacted:
                raise Compacted(rv, self._compacted)
            objects = dict(self._objects[bucket])
            for change in reversed(self._history):
                if change.rv <= rv:
                    break
                if change.bucket != bucket:
                    continue
                if change.prev is None:
                    objects.pop(change.key, None)
                else:
                    objects[change.key] = change.prev
            return rv, sorted(objects.items())

    def watch(
        self, bucket: str, since: int | None, initial: bool, initial_end: bool = False
    ) -> Watcher:
        """A watcher primed with every change after ``since``, or, with ``initial``, a
        synthetic ADDED per current object (then, with ``initial_end``, the bookmark that
        closes them); either way atomically with registration."""
        with self.lock:
            if since is not None and since < self._compacted:
                raise Compacted(since, self._compacted)
            watcher = Watcher(bucket)
            if initial:
                for key, obj in sorted(self._objects[bucket].items()):
                    watcher.push(Change(self._rv, bucket, ADDED, key, obj, None))
                if initial_end:
                    watcher.push(Bookmark(self._rv, initial_events_end=True))
            if since is not None:
                for change in self._history:
                    if change.rv > since and change.bucket == bucket:
                        watcher.push(change)
            if self._closed:
                watcher.push(Closed())
            self._watchers.add(watcher)
            return watcher

    def watching(self) -> int:
        with self.lock:
            return len(self._watchers)

    def unwatch(self, watcher: Watcher) -> None:
        with self.lock:
            self._watchers.discard(watcher)

    def bookmark(self, watcher: Watcher, initial_events_end: bool = False) -> None:
        """Queue a bookmark at the current resourceVersion behind every change already queued."""
        with self.lock:
            watcher.push(Bookmark(self._rv, initial_events_end))

    def wait_for(self, rv: int, timeout: float) -> bool:
        """Wait until the store has reached ``rv`` (a client may know a newer one than us)."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while self._rv < rv and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._advanced.wait(left)
            return self._rv >= rv

    def compact(self) -> int:
        with self.lock:
            self._compacted = self._rv
            self._history.clear()
            return self._compacted

    def reopen(self) -> None:
        """After close(): serve again with the same objects (an API server restart over the
        same etcd)."""
        with self.lock:
            self._closed = False

    def close(self) -> None:
        with self.lock:
            self._closed = True
            for watcher in self._watchers:
                watcher.push(Closed())
            self._advanced.notify_all()
