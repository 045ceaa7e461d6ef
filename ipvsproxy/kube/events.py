"""Kubernetes Events for problems an operator must see: a Service that cannot be programmed, and
why. Rate-limited per object and reason, and posted from a thread of their own so that an API
server that is slow or away never holds up a sync."""

from __future__ import annotations

import datetime
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ipvsproxy.kube.events")


class EventRecorder:
    def __init__(
        self,
        post: Callable[[str, dict[str, Any]], object],
        node: str,
        interval: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.post = post  # (namespace, events.k8s.io/v1 Event body)
        self.node = node
        self.interval = interval
        self.clock = clock
        self.last: dict[tuple[str, str, str], float] = {}
        self.queue: queue.Queue[tuple[str, dict[str, Any]] | None] = queue.Queue(maxsize=1000)
        self.thread = threading.Thread(target=self._run, name="events", daemon=True)
        self.thread.start()

    def warn(self, service: str, reason: str, note: str) -> bool:
        """Queue a Warning about ``service`` (namespace/name); False if rate-limited."""
        key = (service, reason, note)
        now = self.clock()
        if now - self.last.get(key, -self.interval) < self.interval:
            return False
        self.last[key] = now
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
            "note": note[:1024],
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
