"""A read-only API server that serves one fixed snapshot of a cluster, for ``bench.memory``.

Why not the real kube-apiserver (``lab/cluster/controlplane.py``): the memory benchmark needs 5,000
and 10,000 Services with 10 endpoints each in the lab guest, where ``ipvsproxy run`` programs
IPVS. Measured at 0aa6375 on the 2-core host, the real server took about 107 objects/s
(Services and EndpointSlices created over HTTPS by 4 clients, 1,000 x 10: 2,000 objects in
18.8 s, kube-apiserver's peak RSS 335 MiB); in the guest, where kube-apiserver starts in ~33 s
against ~6 s on the host, loading the 30,000 objects of both sizes would take about half an
hour, and etcd and kube-apiserver holding them would share the guest's 3 GB with the process
whose peak memory is being measured. It would also refuse the cluster: with every port of a
NodePort Service given a node port, 10,000 Services exhaust 30000-32767 (see
``lab.cluster.synthetic``). The benchmark measures what ipvsproxy holds, not how objects get to it,
so this serves the snapshot as the real server's watch cache answers an informer:

- ``GET /api/v1/services``, ``/apis/discovery.k8s.io/v1/endpointslices``, ``/api/v1/nodes``
  (resourceVersion "0" or any): every item in one answer, at resourceVersion "1", as the watch
  cache serves a list at "0" (``limit`` and selectors are not applied: the snapshot holds
  only what ipvsproxy's selectors select, and one Node);
- with ``watch=true``: a stream of BOOKMARK events, one a second, until ``timeoutSeconds``
  (nothing ever changes);
- ``POST`` of an events.k8s.io/v1 Event: 201, the Event back (not kept).

Anything else is 404. ipvsproxy's behaviour against an API server is tested against the real
one (tests/unit/test_informer.py, tests/e2e, tests/kernel/test_daemon_e2e.py), not this.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

RESOURCE_VERSION = "1"
# path: (apiVersion, list kind, item kind)
PATHS = {
    "/api/v1/services": ("v1", "ServiceList", "Service"),
    "/apis/discovery.k8s.io/v1/endpointslices": (
        "discovery.k8s.io/v1",
        "EndpointSliceList",
        "EndpointSlice",
    ),
    "/api/v1/nodes": ("v1", "NodeList", "Node"),
}
BOOKMARK_INTERVAL_S = 1.0


class SnapshotAPI:
    """Serves ``services``, ``slices`` and ``nodes`` on ``host:port`` (0: any free port)."""

    def __init__(
        self,
        services: Iterable[dict[str, Any]],
        slices: Iterable[dict[str, Any]],
        nodes: Iterable[dict[str, Any]],
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        items = {
            "/api/v1/services": list(services),
            "/apis/discovery.k8s.io/v1/endpointslices": list(slices),
            "/api/v1/nodes": list(nodes),
        }
        # Encoded once: the server's own memory is not what is measured, its speed is not
        # either, and a list of 10,000 x 10 is encoded in a few seconds in the guest.
        self.bodies = {
            path: json.dumps(
                {
                    "kind": kind,
                    "apiVersion": api_version,
                    "metadata": {"resourceVersion": RESOURCE_VERSION},
                    "items": items[path],
                }
            ).encode()
            for path, (api_version, kind, _) in PATHS.items()
        }
        self.stopping = threading.Event()
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.httpd.daemon_threads = True
        self.host, self.port = str(self.httpd.server_address[0]), int(self.httpd.server_address[1])
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> SnapshotAPI:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig for the official client: plain HTTP, a token nobody checks."""
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "bench", "cluster": {"server": self.url}}],
                    "users": [{"name": "bench", "user": {"token": "bench"}}],
                    "contexts": [
                        {"name": "bench", "context": {"cluster": "bench", "user": "bench"}}
                    ],
                    "current-context": "bench",
                }
            )
        )
        return path


def _handler(api: SnapshotAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            if url.path not in api.bodies:
                self._send(404, b'{"kind":"Status","status":"Failure","code":404}')
            elif query.get("watch", ["false"])[0] == "true":
                self._watch(url.path, float(query.get("timeoutSeconds", ["300"])[0]))
            else:
                self._send(200, api.bodies[url.path])

        def _watch(self, path: str, timeout: float) -> None:
            api_version, _, kind = PATHS[path]
            bookmark = {
                "type": "BOOKMARK",
                "object": {
                    "kind": kind,
                    "apiVersion": api_version,
                    "metadata": {"resourceVersion": RESOURCE_VERSION},
                },
            }
            line = json.dumps(bookmark).encode() + b"\n"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            end = time.monotonic() + timeout
            try:
                while time.monotonic() < end and not api.stopping.is_set():
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                    api.stopping.wait(min(BOOKMARK_INTERVAL_S, max(end - time.monotonic(), 0)))
                self.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass  # the client went away
            self.close_connection = True

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if self.path.startswith("/apis/events.k8s.io/v1/namespaces/"):
                self._send(201, body)
            else:
                self._send(404, b'{"kind":"Status","status":"Failure","code":404}')

    return Handler
