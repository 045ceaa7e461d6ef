"""/healthz with upstream kube-proxy's semantics and JSON body; /livez and /readyz for the
kubelet's probes.

/healthz is upstream's ProxyHealthServer's (pkg/proxy/healthcheck/proxy_health.go): unhealthy
only once the oldest change queued and not yet applied was queued the timeout ago or more
(2 x syncPeriod by default); healthy while starting and after every sync that ran to its end;
also unhealthy while the node is being deleted or carries the ToBeDeletedByClusterAutoscaler
taint (what load balancers should see).

/livez means "the sync loop is alive", not "every rule applied" (upstream's /livez is /healthz
without the node's eligibility): unhealthy only once the oldest change queued was queued the
timeout ago or more and no sync ended since, whatever that sync's outcome. A kernel that
refuses the rules is reported (Events, metrics, /healthz), and a restart would only meet it
again. /readyz is unhealthy until the first full sync ended, then as /livez: the startup probe
on it keeps liveness from judging a big cluster's first sync, and readiness on it keeps a
draining node's pod available.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ipvsproxy.servers.httpserver import HTTPServer, Response, text


def _rfc3339(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class HealthState:
    timeout: float
    last_updated: float | None = None  # when a sync last ran to its end (or the runner started)
    oldest_queued: float | None = None  # when the oldest change queued since then was queued
    node_eligible: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)
    # IP families this node does not serve, and why (shown, never a failure: upstream runs
    # the families it can)
    unserved: dict[str, str] = field(default_factory=dict)
    # Served IP families no address of this node carries NodePorts for, and why (shown, never
    # a failure: their cluster IPs, external IPs and load-balancer VIPs are served)
    no_node_ports: dict[str, str] = field(default_factory=dict)
    # What of the state file cannot be read or written (shown, never a failure: the node is
    # programmed; only a restart meanwhile would know less of what is ours)
    state_file: str | None = None
    # The IP families served ("IPv4", "IPv6"): one proxier stands for each in the body's
    # ``status``, as upstream's per-family proxiers.
    families: tuple[str, ...] = ()
    oldest_unsynced: float | None = None  # the oldest change queued that no sync ended since
    first_full_sync: float | None = None  # when the first full sync ended (any outcome)

    def queued(self, now: float | None = None) -> None:
        with self.lock:
            now = now or time.time()
            if self.oldest_queued is None:
                self.oldest_queued = now
            if self.oldest_unsynced is None:
                self.oldest_unsynced = now

    def sync_ended(self, full: bool, now: float | None = None) -> None:
        """A sync ended, whatever its outcome: the sync loop is alive."""
        with self.lock:
            now = now or time.time()
            self.oldest_unsynced = None
            if full and self.first_full_sync is None:
                self.first_full_sync = now

    def updated(self, now: float | None = None) -> None:
        with self.lock:
            self.last_updated = now or time.time()
            self.oldest_queued = None

    def status(self, node_check: bool, now: float | None = None) -> tuple[int, dict[str, Any]]:
        """/healthz (``node_check``) as upstream's, or upstream's /livez."""
        now = now or time.time()
        with self.lock:
            healthy = self.oldest_queued is None or now - self.oldest_queued < self.timeout
            eligible = self.node_eligible or not node_check
            return self._answer(healthy, now, node_check, eligible)

    def live(self, now: float | None = None) -> tuple[int, dict[str, Any]]:
        """/livez: the sync loop is alive (a change queued the timeout ago was followed by
        the end of a sync)."""
        now = now or time.time()
        with self.lock:
            return self._answer(self._alive(now), now, False)

    def ready(self, now: float | None = None) -> tuple[int, dict[str, Any]]:
        """/readyz: the first full sync ended and the sync loop is alive."""
        now = now or time.time()
        with self.lock:
            started = self.first_full_sync is not None
            return self._answer(started and self._alive(now), now, False)

    def _alive(self, now: float) -> bool:
        return self.oldest_unsynced is None or now - self.oldest_unsynced < self.timeout

    def _answer(
        self, healthy: bool, now: float, node_check: bool, eligible: bool = True
    ) -> tuple[int, dict[str, Any]]:
        """The status code (200: ``healthy`` and ``eligible``) and upstream's body, whose
        ``healthy`` is the proxier's alone (called with ``lock`` held)."""
        ok = healthy and eligible
        # Upstream answers lastUpdated = currentTime while healthy (its older releases'
        # meaning: the sync loop ran recently).
        body: dict[str, Any] = {
            "lastUpdated": _rfc3339(now if ok else self.last_updated),
            "currentTime": _rfc3339(now),
            "healthy": healthy,
        }
        if self.last_updated is not None and self.families:
            updated = _rfc3339(self.last_updated)
            body["status"] = {
                f: {"lastUpdated": updated, "healthy": healthy} for f in self.families
            }
        if node_check:
            body["nodeEligible"] = self.node_eligible
        if self.unserved:
            body["unservedIPFamilies"] = dict(self.unserved)
        if self.no_node_ports:
            body["noNodePortAddressIPFamilies"] = dict(self.no_node_ports)
        if self.state_file:
            body["stateFile"] = self.state_file
        return (200 if ok else 503), body


# A route answers (status code, content type, body).
Route = Callable[[], tuple[int, str, bytes]]


def serve_routes(
    address: str, routes: Mapping[str, Route], name: str, workers: int = 0
) -> HTTPServer:
    """GET on each path calls its route, served from a daemon thread (see
    ipvsproxy.servers.httpserver: idle connections time out and cannot block a probe);
    ``workers`` threads run routes that may wait."""
    host, _, port = address.rpartition(":")

    def handle(path: str) -> Response:
        route = routes.get(path)
        if route is None:
            return text(404, "404 page not found")
        code, ctype, data = route()
        return Response(code, ctype, data)

    return HTTPServer(host.strip("[]") or "0.0.0.0", int(port), handle, name, workers=workers)


def json_route(produce: Callable[[], tuple[int, Any]]) -> Route:
    def route() -> tuple[int, str, bytes]:
        code, body = produce()
        return code, "application/json", json.dumps(body).encode()

    return route


def routes(
    state: HealthState, answered: Callable[[str, int], object] = lambda _probe, _code: None
) -> dict[str, Route]:
    """/healthz (the node's eligibility too), /livez and /readyz; each answer of the first
    two is handed to ``answered`` ("healthz" or "livez", the status code), for upstream's
    counters."""

    def probe(name: str, status: Callable[[], tuple[int, Any]]) -> Route:
        def answer() -> tuple[int, Any]:
            code, body = status()
            if name:
                answered(name, code)
            return code, body

        return json_route(answer)

    return {
        "/healthz": probe("healthz", lambda: state.status(node_check=True)),
        "/livez": probe("livez", state.live),
        "/readyz": probe("", state.ready),
    }


def serve(
    state: HealthState,
    address: str,
    answered: Callable[[str, int], object] = lambda _probe, _code: None,
) -> HTTPServer:
    return serve_routes(address, routes(state, answered), "healthz")
