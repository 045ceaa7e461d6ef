"""Informers: list, then watch from the list's resourceVersion, with the official client.

Objects are kept as the JSON dicts the API sends (the client's model classes are never built:
that is most of the client's cost and the planner reads dicts). A dropped watch resumes from
the last resourceVersion seen (bookmarks included); a 410 Gone relists and reports only the
differences against the cache, so a relist never rewrites the dataplane. Transient failures
are retried with exponential backoff and jitter.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import tenacity
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as _k8s_watch

log = logging.getLogger("ipvsproxy.watch")
iter_resp_lines: Callable[[Any], Any] = _k8s_watch.iter_resp_lines

Obj = dict[str, Any]
Kept = Mapping[str, Any]  # what the cache keeps of an object (see ``transform``)
Handler = Callable[[str, Kept | None, Kept | None], None]  # key, old, new


class Gone(Exception):
    """The resourceVersion we watch from was compacted away (HTTP 410)."""


def _rv(obj: Mapping[str, Any]) -> Any:
    """An object is unchanged while its resourceVersion is: watch events carry kind and
    apiVersion that list items lack, so comparing whole objects would see every one changed."""
    return (obj.get("metadata") or {}).get("resourceVersion")


def key_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta.get('name')}" if ns else str(meta.get("name"))


@dataclass
class Counters:
    lists: int = 0
    relists_after_gone: int = 0
    watches: int = 0
    events: int = 0
    bookmarks: int = 0


def _retryable(exc: BaseException) -> bool:
    if isinstance(exc, ApiException):
        return exc.status is None or exc.status >= 500 or exc.status == 429
    return isinstance(exc, OSError | ValueError) or type(exc).__module__.startswith("urllib3")


class Informer:
    def __init__(
        self,
        name: str,
        list_fn: Callable[..., Any],
        on_change: Handler,
        *,
        stop: threading.Event,
        page_size: int = 500,
        watch_timeout: int = 300,
        label_selector: str | None = None,
        field_selector: str | None = None,
        max_backoff: float = 30.0,
        transform: Callable[[Obj], Kept] | None = None,
    ) -> None:
        self.name = name
        # What the cache keeps of each object (see ipvsproxy.compact); None: all of it.
        self.transform: Callable[[Obj], Kept] = transform or dict
        self.list_fn = list_fn
        self.on_change = on_change
        self.stop = stop
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.selectors = {
            k: v
            for k, v in (("label_selector", label_selector), ("field_selector", field_selector))
            if v
        }
        self.cache: dict[str, Kept] = {}
        self.resource_version: str | None = None
        self.synced = threading.Event()
        self.counters = Counters()
        self._retry = tenacity.Retrying(
            retry=tenacity.retry_if_exception(_retryable),
            wait=tenacity.wait_random_exponential(multiplier=0.2, max=max_backoff),
            before_sleep=self._log_retry,
            reraise=True,
        )

    def _log_retry(self, state: tenacity.RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        log.warning("%s: %s; retrying (attempt %d)", self.name, exc, state.attempt_number)

    def run(self) -> None:
        """List and watch until ``stop`` is set."""
        while not self.stop.is_set():
            try:
                self._retry(self._cycle)
            except Gone:
                continue
            except Exception as exc:  # never let the informer thread die
                log.error("%s: %s", self.name, exc)
                self.stop.wait(1.0)

    def _cycle(self) -> None:
        if self.resource_version is None:
            self.relist()
        try:
            self.watch_once()
        except Gone:
            log.info("%s: resourceVersion %s is gone; relisting", self.name, self.resource_version)
            self.counters.relists_after_gone += 1
            self.resource_version = None
            raise

    def relist(self) -> None:
        """List every page and report what differs from the cache."""
        fresh: dict[str, Kept] = {}
        token: str | None = None
        rv = None
        while True:
            kwargs: dict[str, Any] = {"limit": self.page_size, **self.selectors}
            if token:
                kwargs["_continue"] = token
            resp = self.list_fn(_preload_content=False, _request_timeout=60, **kwargs)
            body = json.loads(resp.data)
            rv = rv or body["metadata"].get("resourceVersion")
            for item in body.get("items") or []:
                fresh[key_of(item)] = self.transform(item)
            token = body["metadata"].get("continue")
            if not token:
                break
        self.counters.lists += 1
        old, self.cache = self.cache, fresh
        for key in sorted(set(old) | set(fresh)):
            before, after = old.get(key), fresh.get(key)
            if before is None or after is None or _rv(before) != _rv(after):
                self.on_change(key, before, after)
        self.resource_version = rv
        self.synced.set()

    def watch_once(self) -> None:
        """One watch request, resumed from the last resourceVersion; returns when it ends."""
        self.counters.watches += 1
        resp = self.list_fn(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout,
            _preload_content=False,
            _request_timeout=(10, self.watch_timeout + 30),
            **self.selectors,
        )
        try:
            for line in iter_resp_lines(resp):
                if self.stop.is_set():
                    return
                self._event(json.loads(line))
        finally:
            resp.release_conn()

    def _event(self, event: Mapping[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(obj.get("message"))
            raise ApiException(status=obj.get("code"), reason=obj.get("message"))
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        if kind == "BOOKMARK":
            self.counters.bookmarks += 1
            self.resource_version = rv or self.resource_version
            return
        self.counters.events += 1
        key = key_of(obj)
        old = self.cache.get(key)
        if kind == "DELETED":
            self.cache.pop(key, None)
            self.on_change(key, old, None)
        else:
            self.cache[key] = self.transform(obj)
            self.on_change(key, old, self.cache[key])
        self.resource_version = rv or self.resource_version
