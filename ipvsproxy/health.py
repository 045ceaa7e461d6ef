"""/healthz and /livez with upstream kube-proxy's semantics and JSON body.

Healthy when the last queued change was applied within the timeout (upstream's
ProxierHealthServer: 2 x syncPeriod by default); /healthz is also unhealthy while the node is
being deleted or carries the ToBeDeletedByClusterAutoscaler taint, and before the first sync.
"""

from __future__ import annotations

import datetime
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _rfc3339(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class HealthState:
    timeout: float
    last_updated: float | None = None  # when a sync last completed
    oldest_queued: float | None = None  # when the oldest change still unapplied was queued
    node_eligible: bool = True
    lock: threading.Lock = field(default_factory=threading.Lock)

    def queued(self, now: float | None = None) -> None:
        with self.lock:
            if self.oldest_queued is None:
                self.oldest_queued = now or time.time()

    def updated(self, now: float | None = None) -> None:
        with self.lock:
            self.last_updated = now or time.time()
            self.oldest_queued = None

    def status(self, node_check: bool, now: float | None = None) -> tuple[int, dict[str, Any]]:
        now = now or time.time()
        with self.lock:
            healthy = self.last_updated is not None and (
                self.oldest_queued is None or now - self.oldest_queued <= self.timeout
            )
            body: dict[str, Any] = {
                "lastUpdated": _rfc3339(self.last_updated),
                "currentTime": _rfc3339(now),
            }
            if node_check:
                body["nodeEligible"] = self.node_eligible
                healthy = healthy and self.node_eligible
        return (200 if healthy else 503), body


def serve(state: HealthState, address: str) -> ThreadingHTTPServer:
    host, _, port = address.rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/healthz", "/livez"):
                self.send_error(404)
                return
            code, body = state.status(node_check=self.path.startswith("/healthz"))
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="healthz", daemon=True).start()
    return server
