"""Kubernetes Events for problems an operator must see: a Service that cannot be programmed, and
why. Limited per object and reason as client-go's EventSourceObjectSpamFilter limits them per
source and object (tools/record/events_cache.go): a token bucket of ``BURST`` Events refilled
at one per ``REFILL`` seconds, kept in an LRU of ``CACHE_SIZE`` entries; and a note repeated
within ``interval`` is posted once. Nothing of a note is kept, and a note is cut to
``MAX_NOTE`` bytes. Posted from a thread of their own so that an API server that is slow
or away never holds up a sync."""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("ipvsproxy.kube.events")

BURST = 25  # client-go's defaultSpamBurst
REFILL = 300.0  # seconds per token: client-go's defaultSpamQPS, 1/300
CACHE_SIZE = 4096  # client-go's maxLruCacheEntries
MAX_NOTE = 1024  # bytes of UTF-8: the API refuses a longer note (NoteLengthLimit)


@dataclass(slots=True)
class _Record:
    """What the filter keeps of one (object, reason): its token bucket, and a digest of the
    last note posted (never the note itself) with when."""

    tokens: float
    at: float  # when ``tokens`` was last refilled
    note: int = 0  # hash of the last note posted
    posted: float = float("-inf")


class SpamFilter:
    """client-go's EventSourceObjectSpamFilter keyed by (object, reason), plus the recorder's
    own rule that a repeated note waits ``interval``. Holds at most ``size`` records, the least
    recently used going first (an object forgotten starts again with a full bucket)."""

    def __init__(self, interval: float, burst: int, refill: float, size: int) -> None:
        self.interval, self.burst, self.refill, self.size = interval, burst, refill, size
        self.records: OrderedDict[tuple[str, str], _Record] = OrderedDict()

    def allow(self, key: tuple[str, str], note: str, now: float) -> bool:
        """Whether an Event with ``note`` about ``key`` may be posted now (it is then
        counted)."""
        record = self.records.get(key)
        if record is None:
            record = self.records[key] = _Record(float(self.burst), now)
            if len(self.records) > self.size:
                self.records.popitem(last=False)
        else:
            self.records.move_to_end(key)
        digest = hash(note)
        if digest == record.note and now - record.posted < self.interval:
            return False  # the same note again: no token taken
        record.tokens = min(self.burst, record.tokens + (now - record.at) / self.refill)
        record.at = now
        if record.tokens < 1:
            return False
        record.tokens -= 1
        record.note, record.posted = digest, now
        return True


class EventRecorder:
    def __init__(
        self,
        post: Callable[[str, dict[str, Any]], object],
        node: str,
        interval: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        *,
        burst: int = BURST,
        refill: float = REFILL,
        size: int = CACHE_SIZE,
    ) -> None:
        self.post = post  # (namespace, events.k8s.io/v1 Event body)
        self.node = node
        self.interval = interval
        self.clock = clock
        self.filter = SpamFilter(interval, burst, refill, size)
        self._lock = threading.Lock()  # guards filter (warn may be called from any thread)
        self.records = self.filter.records
        self.queue: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue(maxsize=1000)
        self.thread = threading.Thread(target=self._run, name="events", daemon=True)
        self.thread.start()

    def warn(self, service: str, reason: str, note: str) -> bool:
        """Queue a Warning about ``service`` (namespace/name); False if rate-limited."""
        note = note.encode()[:MAX_NOTE].decode(errors="ignore")
        with self._lock:
            if not self.filter.allow((service, reason), note, self.clock()):
                return False
        ns, _, name = service.partition("/")
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        body = {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": ns},
            "eventTime": stamp,
            "reportingController": "ipvsproxy",
            "reportingInstance": f"ipvsproxy-{self.node}",
            "action": "Programming",
            "reason": reason,
            "note": note,
            "type": "Warning",
            "regarding": {"apiVersion": "v1", "kind": "Service", "namespace": ns, "name": name},
        }
        try:
            self.queue.put_nowait((ns, body))
        except queue.Full:
            return False
        return True

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            ns, body = item
            try:
                self.post(ns, body)
            except Exception as exc:  # an Event that cannot be posted is only logged
                log.warning("could not post event %s: %s", body["reason"], exc)
            finally:
                self.queue.task_done()

    def close(self) -> None:
        self.queue.put(None)
