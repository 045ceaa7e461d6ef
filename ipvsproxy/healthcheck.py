"""Health-check node ports for externalTrafficPolicy Local Services (upstream's format).

A cloud load balancer probes each node on the Service's healthCheckNodePort and sends traffic
only to nodes that answer 200: those with a local endpoint. One small HTTP server per port.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("ipvsproxy.healthcheck")


@dataclass(frozen=True)
class Target:
    service: str  # namespace/name
    local_endpoints: int


class _Server:
    def __init__(self, port: int, target: Target) -> None:
        self.target = target
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                t = owner.target
                ns, _, name = t.service.partition("/")
                body = json.dumps(
                    {
                        "service": {"namespace": ns, "name": name},
                        "localEndpoints": t.local_endpoints,
                        "serviceProxyHealthy": True,
                    }
                ).encode()
                self.send_response(200 if t.local_endpoints > 0 else 503)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Content-Type-Options", "nosniff")
                self.send_header("X-Load-Balancing-Endpoint-Weight", str(t.local_endpoints))
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, name=f"hc-{port}", daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class HealthCheckServers:
    def __init__(self) -> None:
        self.servers: dict[int, _Server] = {}

    def sync(self, wanted: Mapping[int, Target]) -> None:
        """Serve exactly ``wanted`` (port -> target); a port that cannot be bound is logged."""
        for port in set(self.servers) - set(wanted):
            self.servers.pop(port).close()
        for port, target in wanted.items():
            if port in self.servers:
                self.servers[port].target = target
                continue
            try:
                self.servers[port] = _Server(port, target)
            except OSError as exc:
                log.error("health check port %d for %s: %s", port, target.service, exc)

    def close(self) -> None:
        self.sync({})
