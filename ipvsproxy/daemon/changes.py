"""Change tracking: the informers' Services and EndpointSlices, and which Services changed since
the last sync (upstream's ServiceChangeTracker and EndpointsChangeTracker in one)."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable

from ipvsproxy.core.service_ports import LABEL_SERVICE_NAME
from ipvsproxy.kube import slim
from ipvsproxy.kube.informer import Kept

TRIGGER_ANNOTATION = slim.TRIGGER_ANNOTATION

# A Service marked as changed -> the wall time its change was triggered (None: unknown).
Marks = dict[str, float | None]


class ChangeTracker:
    """The Services and EndpointSlices as the informers last saw them, and the marks of the
    Services changed since the last ``take()``.

    ``cond`` guards all of it; it is notified whenever a Service is marked, and the sync runner
    waits on it. A Service is marked at most once between two takes: its first known trigger
    time stays (a later mark only fills in one that was unknown). ``on_mark`` runs under
    ``cond`` at every mark."""

    def __init__(self, on_mark: Callable[[], None] = lambda: None) -> None:
        self.cond = threading.Condition()
        self.services: dict[str, Kept] = {}
        self.slices: dict[str, dict[str, Kept]] = {}  # service key -> slice key -> slice
        self.dirty: Marks = {}
        self._on_mark = on_mark

    def set_service(self, key: str, new: Kept | None) -> None:
        """The informer's Service ``key`` is now ``new`` (None: deleted)."""
        with self.cond:
            if new is None:
                self.services.pop(key, None)
            else:
                self.services[key] = new

    def set_slice(self, key: str, old: Kept | None, new: Kept | None) -> str | None:
        """The informer's EndpointSlice ``key`` is now ``new`` (None: deleted); returns the
        Service it belongs to (None: a slice without the service-name label, ignored)."""
        obj = new or old or {}
        meta = obj.get("metadata") or {}
        name = (meta.get("labels") or {}).get(LABEL_SERVICE_NAME)
        if not name:
            return None
        service = f"{meta.get('namespace')}/{name}"
        with self.cond:
            bucket = self.slices.setdefault(service, {})
            if new is None:
                bucket.pop(key, None)
            else:
                bucket[key] = new
        return service

    def mark(self, service: str, trigger: float | None) -> None:
        with self.cond:
            if self.dirty.get(service) is None:
                self.dirty[service] = trigger
            self._on_mark()
            self.cond.notify_all()

    def mark_where(self, wanted: Callable[[Kept], bool]) -> None:
        """Mark every Service whose object is ``wanted``."""
        with self.cond:
            keys = [key for key, svc in self.services.items() if wanted(svc)]
        for key in keys:
            self.mark(key, None)

    def mark_where_slices(self, wanted: Callable[[list[Kept]], bool]) -> None:
        """Mark every Service whose EndpointSlices are ``wanted``."""
        with self.cond:
            keys = [key for key, by in self.slices.items() if wanted(list(by.values()))]
        for key in keys:
            self.mark(key, None)

    def take(self) -> Marks:
        """The marks since the last take; none are left."""
        with self.cond:
            dirty, self.dirty = self.dirty, {}
            return dirty

    def pending(self) -> int:
        """How many Services are marked."""
        with self.cond:
            return len(self.dirty)

    def inputs(self, service: str) -> tuple[Kept | None, list[Kept]]:
        """What the dataplane plans ``service`` from: its object (None: deleted) and slices."""
        with self.cond:
            return self.services.get(service), list(self.slices.get(service, {}).values())


def trigger_time(obj: Kept | None) -> float | None:
    """The wall time an EndpointSlice's change was triggered (its trigger annotation)."""
    if not obj:
        return None
    text = ((obj.get("metadata") or {}).get("annotations") or {}).get(TRIGGER_ANNOTATION)
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
