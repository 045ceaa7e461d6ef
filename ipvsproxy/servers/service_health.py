"""Health-check node ports for externalTrafficPolicy Local Services (upstream's
pkg/proxy/healthcheck/service_health.go).

A cloud load balancer probes each node on the Service's healthCheckNodePort and sends traffic
only to nodes that answer 200: those with a local endpoint, while the proxy itself is healthy
(upstream's IsHealthy, /livez's answer: the node's eligibility is /healthz's business). Each
port listens on the node-port addresses (``nodePortAddresses``' matches), or on every address
when that is unset; a port that cannot be bound is a Warning Event on its Service and is tried
again at the next sync. Every port is served from one thread (one ``Loop``), and takes one
listening socket per address: hundreds of such Services use neither hundreds of threads nor
the descriptors a container has.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ipvsproxy.servers.httpserver import HTTPServer, Loop, Response

log = logging.getLogger("ipvsproxy.servers.service_health")
# Both families (a wildcard does): upstream's IPv4 and IPv6 proxiers listen on 0.0.0.0 and ::.
EVERY_ADDRESS = ("0.0.0.0",)


@dataclass(frozen=True)
class Target:
    service: str  # namespace/name
    local_endpoints: int


class _Server:
    """One port: an HTTP server per address, all answering for ``target``."""

    def __init__(
        self,
        port: int,
        addresses: tuple[str, ...],
        target: Target,
        healthy: Callable[[], bool],
        loop: Loop,
    ) -> None:
        self.target = target
        self.addresses = addresses
        self.healthy = healthy
        self.httpds: list[HTTPServer] = []
        try:
            for address in addresses:
                self.httpds.append(HTTPServer(address, port, self._answer, f"hc-{port}", loop=loop))
        except OSError:
            self.close()  # what was opened goes, so the next sync tries the whole port again
            raise

    def _answer(self, _path: str) -> Response:
        t = self.target
        proxy_healthy = self.healthy()
        ns, _, name = t.service.partition("/")
        body = json.dumps(
            {
                "service": {"namespace": ns, "name": name},
                "localEndpoints": t.local_endpoints,
                "serviceProxyHealthy": proxy_healthy,
            }
        ).encode()
        return Response(
            200 if t.local_endpoints > 0 and proxy_healthy else 503,
            "application/json",
            body,
            [("X-Load-Balancing-Endpoint-Weight", str(t.local_endpoints))],
        )

    def close(self) -> None:
        for httpd in self.httpds:
            httpd.close()
        self.httpds = []


class HealthCheckServers:
    def __init__(
        self,
        proxy_healthy: Callable[[], bool] = lambda: True,
        report: Callable[[str, str, str], object] | None = None,
        node: str = "",
    ) -> None:
        self.servers: dict[int, _Server] = {}
        self.proxy_healthy = proxy_healthy
        self.report = report  # (service, reason, message): a Warning Event
        self.node = node
        self._loop: Loop | None = None  # every port's, from the first one on

    def _shared_loop(self) -> Loop:
        if self._loop is None:
            self._loop = Loop("health-checks")
        return self._loop

    def sync(self, wanted: Mapping[int, Target], addresses: Sequence[str] | None = None) -> None:
        """Serve exactly ``wanted`` (port -> target) on ``addresses`` (None: every address;
        empty: none, as upstream when no node address matches nodePortAddresses); a port that
        cannot be bound is logged and reported."""
        listen = EVERY_ADDRESS if addresses is None else tuple(sorted(addresses))
        for port in set(self.servers) - set(wanted):
            self.servers.pop(port).close()
        for port, target in wanted.items():
            server = self.servers.get(port)
            if server is not None and server.addresses == listen:
                server.target = target
                continue
            if server is not None:
                self.servers.pop(port).close()
            try:
                self.servers[port] = _Server(
                    port, listen, target, self.proxy_healthy, self._shared_loop()
                )
            except OSError as exc:
                message = (
                    f'node {self.node} failed to start healthcheck "{target.service}" '
                    f"on port {port}: {exc}"
                )
                log.error("%s", message)
                if self.report is not None:
                    self.report(target.service, "FailedToStartServiceHealthcheck", message)

    def close(self) -> None:
        self.sync({})
        if self._loop is not None:
            self._loop.close()
            self._loop = None
