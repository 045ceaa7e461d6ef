"""Change tracking: the informers' Services and EndpointSlices, and which Services changed since
the last sync (upstream's ServiceChangeTracker and EndpointsChangeTracker in one)."""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from typing import NamedTuple

from ipvsproxy.core.service_ports import LABEL_SERVICE_NAME
from ipvsproxy.kube import slim
from ipvsproxy.kube.informer import Kept

TRIGGER_ANNOTATION = slim.TRIGGER_ANNOTATION


class Trigger(NamedTuple):
    """When an EndpointSlice change was triggered (its annotation), and the slice's family."""

    at: float  # wall time
    family: int  # 4 or 6


# A Service marked as changed -> the trigger times of its slice changes since the last take.
Marks = dict[str, list[Trigger]]


class ChangeTracker:
    """The Services and EndpointSlices as the informers last saw them, and the marks of the
    Services changed since the last ``take()``.

    ``cond`` guards all of it; it is notified whenever a Service is marked, and the sync runner
    waits on it. ``on_mark`` runs under ``cond`` at every mark. Between two takes:
    - ``dirty`` holds every Service marked, once, with the trigger times of its slice changes
      later than ``started`` (upstream's trackerStartTime), in order; a slice's deletion
      forgets its Service's trigger times of the slice's family (as upstream's tracker);
    - ``service_changes`` holds the Services marked by a change of their Service object and
      ``slice_changes`` counts the slice changes (upstream's two pending gauges);
    - ``sync_requested`` says a sync is wanted though no Service may be marked (the node's
      addresses are to be read again: that sync marks the Services only if they changed)."""

    def __init__(self, on_mark: Callable[[], None] = lambda: None, started: float = 0.0) -> None:
        self.cond = threading.Condition()
        self.services: dict[str, Kept] = {}
        self.slices: dict[str, dict[str, Kept]] = {}  # service key -> slice key -> slice
        self.dirty: Marks = {}
        self.service_changes: set[str] = set()
        self.slice_changes = 0
        self.sync_requested = False
        self.started = started
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
        Service it belongs to (None: a slice without the service-name label, ignored). A
        Service's bucket exists only while it holds a slice."""
        service = slice_service(new or old or {})
        if service is None:
            return None
        with self.cond:
            if new is not None:
                self.slices.setdefault(service, {})[key] = new
            elif (bucket := self.slices.get(service)) is not None:
                bucket.pop(key, None)
                if not bucket:
                    del self.slices[service]
        return service

    def mark(self, service: str) -> None:
        """``service`` changed for a reason other than its objects (the Node, a retry)."""
        with self.cond:
            self.dirty.setdefault(service, [])
            self._marked()

    def mark_service(self, service: str) -> None:
        """``service``'s Service object changed."""
        with self.cond:
            self.service_changes.add(service)
            self.dirty.setdefault(service, [])
            self._marked()

    def mark_slice(
        self, service: str, family: int, trigger: float | None = None, deleted: bool = False
    ) -> None:
        """An EndpointSlice of ``service`` and ``family`` changed (``deleted``: went), its
        change triggered at ``trigger`` (None: unknown)."""
        with self.cond:
            self.slice_changes += 1
            triggers = self.dirty.setdefault(service, [])
            if deleted:
                triggers[:] = [t for t in triggers if t.family != family]
            elif trigger is not None and trigger > self.started:
                triggers.append(Trigger(trigger, family))
            self._marked()

    def request_sync(self) -> None:
        """Ask for a sync without marking a Service."""
        with self.cond:
            self.sync_requested = True
            self.cond.notify_all()

    def _marked(self) -> None:
        self._on_mark()
        self.cond.notify_all()

    def mark_where(self, wanted: Callable[[Kept], bool]) -> None:
        """Mark every Service whose object is ``wanted``."""
        with self.cond:
            keys = [key for key, svc in self.services.items() if wanted(svc)]
        for key in keys:
            self.mark(key)

    def mark_where_slices(self, wanted: Callable[[list[Kept]], bool]) -> None:
        """Mark every Service whose EndpointSlices are ``wanted``."""
        with self.cond:
            keys = [key for key, by in self.slices.items() if wanted(list(by.values()))]
        for key in keys:
            self.mark(key)

    def take(self) -> Marks:
        """The marks since the last take; none are left, nor pending changes, nor a request."""
        with self.cond:
            dirty, self.dirty = self.dirty, {}
            self.sync_requested = False
            self.service_changes = set()
            self.slice_changes = 0
            return dirty

    def pending(self) -> int:
        """How many Services are marked."""
        with self.cond:
            return len(self.dirty)

    def has_work(self) -> bool:
        """Whether a sync is wanted: a Service is marked, or a sync was requested."""
        with self.cond:
            return bool(self.dirty) or self.sync_requested

    def pending_changes(self) -> tuple[int, int]:
        """The Services with a Service change pending, and the slice changes pending."""
        with self.cond:
            return len(self.service_changes), self.slice_changes

    def inputs(self, service: str) -> tuple[Kept | None, list[Kept]]:
        """What the dataplane plans ``service`` from: its object (None: deleted) and slices."""
        with self.cond:
            return self.services.get(service), list(self.slices.get(service, {}).values())


def slice_service(obj: Kept) -> str | None:
    """The Service (namespace/name) an EndpointSlice belongs to by its service-name label;
    None without one."""
    meta = obj.get("metadata") or {}
    name = (meta.get("labels") or {}).get(LABEL_SERVICE_NAME)
    return f"{meta.get('namespace')}/{name}" if name else None


def slice_family(obj: Kept) -> int | None:
    """An EndpointSlice's address family (IPv4 when unset, as the planner reads it); None for
    FQDN and other types no proxier takes."""
    return {"IPv4": 4, "IPv6": 6}.get(obj.get("addressType", "IPv4"))


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
