"""Informers: list, then watch from the list's resourceVersion, as client-go's reflector does.

Objects are kept as the JSON dicts the API sends (the client's model classes are never built:
that is most of the client's cost and the planner reads dicts). The first list asks for
resourceVersion "0", which the API server answers from its watch cache; a relist asks for data
no older than the last resourceVersion seen (also from the cache, so unpaged), and when that
one is expired or not yet known, at once for the latest state (a quorum read). A watch resumes
from the last resourceVersion seen (bookmarks included); 410 Gone, as an event in the stream or
as the answer to the watch request, relists and reports only the differences against the
cache, so a relist never rewrites the dataplane.

Request rates stay bounded whatever the server does: every list-and-watch cycle that ends (a
failed list, a watch that fails, expires or closes within a second with nothing received) is
followed by the reflector's backoff (0.8 s doubling to 30 s, plus up to 100% jitter, back to
0.8 s after two minutes without one), so it costs one list and one watch per backoff. A watch
that ends normally (its timeoutSeconds) is renewed at once; a refused connection or a 429
retries the watch after a backoff, without relisting. A watch silent for ``read_timeout``
seconds is dropped and resumed: a dead connection (no FIN) is noticed within that time.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as _k8s_watch
from urllib3.exceptions import ProtocolError, ReadTimeoutError

from ipvsproxy.kube.list_json import walk_list

log = logging.getLogger("ipvsproxy.kube.informer")
iter_resp_lines: Callable[[Any], Any] = _k8s_watch.iter_resp_lines

Obj = dict[str, Any]
Kept = Mapping[str, Any]  # what the cache keeps of an object (see ``transform``)
Handler = Callable[[str, Kept | None, Kept | None], None]  # key, old, new

# client-go notices a dead HTTP/2 connection after 30 s without a frame plus a 15 s ping
# timeout; urllib3 speaks HTTP/1.1, so a watch silent that long is dropped and resumed.
READ_TIMEOUT = 45.0
CONNECT_TIMEOUT = 10.0
LIST_TIMEOUT = 60.0
SHORT_WATCH = 1.0  # seconds: a watch ending sooner with nothing received is a failure
RETRY_FIRST = 1.0  # seconds before a change a handler raised on is handed to it again
RETRY_MAX = 30.0  # the retry's delay doubles up to this while the handler keeps raising


class StatusError(Exception):
    """An ERROR event in a watch stream: the API Status it carries."""

    def __init__(self, status: Mapping[str, Any]) -> None:
        super().__init__(status.get("message") or status.get("reason") or "watch error")
        self.code = status.get("code")


class ShortWatch(Exception):
    """The watch closed within a second with nothing received."""


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
    handler_errors: int = 0


class Backoff:
    """client-go's reflector backoff (wait.NewExponentialBackoffManager(800ms, 30s, 2min, 2.0,
    1.0)): each delay is the current step plus up to one step of jitter; the step doubles up to
    ``cap`` and starts again from ``initial`` once no delay was asked for ``reset_after``
    seconds (the server is then taken as healthy)."""

    def __init__(
        self,
        initial: float = 0.8,
        cap: float = 30.0,
        reset_after: float = 120.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.initial, self.cap, self.reset_after = initial, cap, reset_after
        self.clock, self.rand = clock, rand
        self._step = initial
        self._last: float | None = None

    def next(self) -> float:
        now = self.clock()
        if self._last is not None and now - self._last > self.reset_after:
            self._step = self.initial
        self._last = now
        step, self._step = self._step, min(self._step * 2, self.cap)
        return step * (1 + self.rand())


def _code(exc: BaseException) -> int | None:
    if isinstance(exc, ApiException):
        return int(exc.status) if exc.status is not None else None
    if isinstance(exc, StatusError) and isinstance(exc.code, int):
        return exc.code
    return None


def _status(exc: BaseException) -> Mapping[str, Any]:
    """The Status body of an API error ({} when there is none)."""
    try:
        body = json.loads(getattr(exc, "body", None) or "{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _message(exc: BaseException) -> str:
    return str(_status(exc).get("message") or getattr(exc, "reason", None) or exc)


def _expired(exc: BaseException) -> bool:
    return _code(exc) == 410


def _too_large_rv(exc: BaseException) -> bool:
    """The requested resourceVersion is newer than the server has (client-go's
    isTooLargeResourceVersionError, older servers' message included)."""
    status = _status(exc)
    causes = (status.get("details") or {}).get("causes") or []
    if any(c.get("reason") == "ResourceVersionTooLarge" for c in causes):
        return True
    return _code(exc) == 504 and (
        "Too large resource version" in str(status.get("message"))
        or any(c.get("message") == "Too large resource version" for c in causes)
    )


def _refused(exc: BaseException | None) -> bool:
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, ConnectionRefusedError):
            return True
        reason = getattr(exc, "reason", None)
        nxt = reason if isinstance(reason, BaseException) else None
        exc, seen = nxt or exc.__cause__ or exc.__context__, seen + 1
    return False


class Informer:
    """One resource's cache, kept by list and watch (see the module docstring).

    Owns ``cache`` (``namespace/name`` -> the object as ``transform`` keeps it, read-only),
    ``resource_version`` (the last one seen, where the next watch resumes) and ``counters``.
    Invariants:
    - ``cache`` is what the last list returned with every watch event since applied in order;
    - ``on_change(key, old, new)`` runs on the thread that runs ``run``, after the cache
      changed, with the value it was last handed for ``key`` and the cached one (None:
      absent): once per added, modified or deleted event, and after a relist once per object
      whose resourceVersion differs, never for the others;
    - a change ``on_change`` raised on is logged, counted (``on_handler_error(key)``) and kept
      in ``undelivered`` (key -> the value it was last handed): handed to it again, from that
      value to the cached one, with the object's next event or relist, or at a retry (after
      each watch event and at each watch's end, once ``RETRY_FIRST`` seconds passed, doubling
      to ``RETRY_MAX`` while it keeps raising); the other objects' changes go on;
    - ``synced`` is set once the first list has completed, and stays set;
    - ``run`` never raises and returns only once ``stop`` is set; every list-and-watch cycle
      that ends is followed by a ``backoff`` delay (a watch that ends normally is renewed
      within its cycle).
    """

    def __init__(
        self,
        name: str,
        list_fn: Callable[..., Any],
        on_change: Handler,
        *,
        stop: threading.Event,
        resource: str | None = None,
        page_size: int = 500,
        watch_timeout: int = 300,
        read_timeout: float = READ_TIMEOUT,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Callable[[Obj], Kept] | None = None,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], bool] | None = None,
        on_handler_error: Callable[[str], object] = lambda _key: None,
    ) -> None:
        self.name = name
        self.resource = resource or name  # as RBAC names it, for the 401/403 hint
        # What the cache keeps of each object (see ipvsproxy.kube.slim); None: all of it.
        self.transform: Callable[[Obj], Kept] = transform or dict
        self.list_fn = list_fn
        self.on_change = on_change
        self.on_handler_error = on_handler_error
        self.undelivered: dict[str, Kept | None] = {}
        self._retry_delay = RETRY_FIRST
        self._retry_at = 0.0
        self.stop = stop
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.read_timeout = read_timeout
        self.selectors = {
            k: v
            for k, v in (("label_selector", label_selector), ("field_selector", field_selector))
            if v
        }
        self.cache: dict[str, Kept] = {}
        self.resource_version: str | None = None
        # The last resourceVersion is expired or unknown to the server: relist the latest.
        self.rv_unavailable = False
        # An RV=0 list came back in pages: no watch cache serves it, so relists page too.
        self.paginated = False
        self.synced = threading.Event()
        self.counters = Counters()
        self.backoff = backoff or Backoff(clock=clock)
        self.clock = clock
        # Sleeps a backoff; True when stopped meanwhile.
        self.sleep: Callable[[float], bool] = sleep or stop.wait

    def run(self) -> None:
        """List and watch until ``stop`` is set, with a backoff after every cycle that ends."""
        while not self.stop.is_set():
            failure: Exception | None = None
            try:
                self.list_and_watch()
            except Exception as exc:  # never let the informer thread die
                failure = exc
            if self.stop.is_set():
                return
            delay = self.backoff.next()
            if failure is not None:
                self._report(failure, delay)
            if self.sleep(delay):
                return

    def _report(self, exc: Exception, delay: float) -> None:
        code, then = _code(exc), f"retrying in {delay:.1f} s"
        what = f"list and watch {self.resource}"
        if code == 401:
            log.error(
                "%s: the API server rejected ipvsproxy's credentials (401 Unauthorized: %s); "
                "it needs a valid ServiceAccount token or kubeconfig to %s; %s",
                self.name, _message(exc), what, then,
            )  # fmt: skip
        elif code == 403:
            log.error(
                "%s: the API server forbids it (403 Forbidden: %s); ipvsproxy's ServiceAccount "
                "must be allowed to %s (RBAC: the ClusterRole and ClusterRoleBinding in "
                "deploy/rbac.yaml); %s",
                self.name, _message(exc), what, then,
            )  # fmt: skip
        elif isinstance(exc, ShortWatch):
            log.warning("%s: %s; relisting, %s", self.name, exc, then)
        else:
            log.warning("%s: %s; %s", self.name, exc, then)

    def list_and_watch(self) -> None:
        """One list, then watches until one fails or expires (its error is raised)."""
        self.relist()
        while not self.stop.is_set() and self.watch_once():
            pass

    # -- listing -------------------------------------------------------------------------------

    def _list_rv(self) -> str:
        if self.rv_unavailable:
            return ""
        return self.resource_version or "0"

    def relist(self) -> None:
        """List (every page) and report what differs from the cache."""
        try:
            fresh, rv = self._list_at(self._list_rv())
        except Exception as exc:
            if not (_expired(exc) or _too_large_rv(exc)):
                raise
            log.info(
                "%s: resourceVersion %s is not available (%s); listing the latest state",
                self.name, self.resource_version, _message(exc),
            )  # fmt: skip
            self.rv_unavailable = True
            fresh, rv = self._list_at("")
        self.rv_unavailable = False
        self.counters.lists += 1
        old, self.cache = self.cache, fresh
        for key in sorted(set(old) | set(fresh) | set(self.undelivered)):
            before, after = old.get(key), fresh.get(key)
            changed = before is None or after is None or _rv(before) != _rv(after)
            if changed or key in self.undelivered:
                self._deliver(key, before, after)
        self.resource_version = rv
        self.synced.set()

    # -- handing changes over ------------------------------------------------------------------

    def _deliver(self, key: str, old: Kept | None, new: Kept | None) -> None:
        """``on_change`` for ``key``, from what it was last handed (``old`` unless a change
        it raised on is pending) to ``new``; an exception is contained (see the class)."""
        old = self.undelivered.get(key, old)
        if old is None and new is None:
            self.undelivered.pop(key, None)  # it never saw the object, which is gone again
            return
        try:
            self.on_change(key, old, new)
        except Exception:
            self.counters.handler_errors += 1
            log.exception(
                "%s: handling the change of %s raised; it is handed over again later",
                self.name, key,
            )  # fmt: skip
            self.undelivered[key] = old
            if self.clock() >= self._retry_at:
                self._retry_at = self.clock() + self._retry_delay
                self._retry_delay = min(RETRY_MAX, self._retry_delay * 2)
            self.on_handler_error(key)
        else:
            self.undelivered.pop(key, None)
            if not self.undelivered:
                self._retry_delay, self._retry_at = RETRY_FIRST, 0.0

    def _retry(self) -> None:
        """Hand the pending changes over again, when their retry is due."""
        if not self.undelivered or self.clock() < self._retry_at:
            return
        for key in sorted(self.undelivered):
            self._deliver(key, self.undelivered[key], self.cache.get(key))

    def _get(self, into: dict[str, Kept], **params: Any) -> dict[str, Any]:
        """One list request: each item, as it is decoded, transformed into ``into`` (see
        ``list_json``); returns the list's other fields."""
        resp = self.list_fn(_preload_content=False, _request_timeout=LIST_TIMEOUT, **params)
        text = resp.data.decode()
        del resp

        def keep(item: Obj) -> None:
            into[key_of(item)] = self.transform(item)

        return walk_list(text, keep)

    def _list_at(self, rv: str) -> tuple[dict[str, Kept], str | None]:
        """The objects and resourceVersion of a list at ``rv`` (client-go's pager: a later page
        that has expired is replaced by one unpaged list at ``rv``)."""
        # Unpaged for a resourceVersion other than ""/"0", so the watch cache can serve it.
        unpaged = rv not in ("", "0") and not self.paginated
        limit = None if unpaged else self.page_size
        params: dict[str, Any] = {"resource_version": rv or None, "limit": limit}
        fresh: dict[str, Kept] = {}
        list_rv: str | None = None
        while True:
            try:
                body = self._get(fresh, **params, **self.selectors)
            except Exception as exc:
                if not (_expired(exc) and params.get("_continue")):
                    raise
                fresh = {}
                body = self._get(fresh, resource_version=rv or None, **self.selectors)
                list_rv = None
            metadata = body.get("metadata") or {}
            list_rv = list_rv or metadata.get("resourceVersion")
            token = metadata.get("continue")
            if not token:
                return fresh, list_rv
            # The API refuses a resourceVersion together with a continue token.
            params = {"limit": limit, "_continue": token}
            if rv == "0":
                self.paginated = True

    # -- watching ------------------------------------------------------------------------------

    def watch_once(self) -> bool:
        """One watch request from the last resourceVersion; True: renew it, False: relist."""
        self.counters.watches += 1
        start = self.clock()
        try:
            resp = self.list_fn(
                watch=True,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.watch_timeout,
                _preload_content=False,
                _request_timeout=(CONNECT_TIMEOUT, self.read_timeout),
                **self.selectors,
            )
        except Exception as exc:
            if _code(exc) == 429 or _refused(exc):
                delay = self.backoff.next()
                log.info("%s: watch: %s; retrying in %.1f s", self.name, _message(exc), delay)
                return not self.sleep(delay)
            if _expired(exc):
                return self._gone(exc)
            raise
        received = 0
        try:
            for line in iter_resp_lines(resp):
                if self.stop.is_set():
                    return True
                if line:
                    self._event(json.loads(line))
                    received += 1
                    self._retry()
        except StatusError as exc:
            if _expired(exc):
                return self._gone(exc)
            raise
        except ReadTimeoutError as exc:
            # Silent for read_timeout: routine for an idle resource (bookmarks come about
            # once a minute), so not worth an operator's attention.
            log.debug("%s: watch silent (%s); resuming", self.name, exc)
        except ProtocolError as exc:  # cut: urllib3 has closed that connection
            log.info("%s: watch stream ended (%s); resuming", self.name, exc)
        finally:
            resp.release_conn()
        self._retry()
        if not received and self.clock() - start < SHORT_WATCH:
            raise ShortWatch("the watch closed within a second with nothing received")
        return True

    def _gone(self, exc: Exception) -> bool:
        log.info(
            "%s: resourceVersion %s is gone (%s); relisting",
            self.name, self.resource_version, _message(exc),
        )  # fmt: skip
        self.counters.relists_after_gone += 1
        return False

    def _event(self, event: Mapping[str, Any]) -> None:
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise StatusError(obj)
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
            self._deliver(key, old, None)
        else:
            self.cache[key] = self.transform(obj)
            self._deliver(key, old, self.cache[key])
        self.resource_version = rv or self.resource_version
