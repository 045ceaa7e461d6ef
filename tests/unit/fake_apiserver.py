"""A scripted HTTP server that answers list and watch requests as a test says, and records
every request's query, for tests/unit/test_informer_retries.py. ipvsproxy's behaviour against
an API server is otherwise tested against the real kube-apiserver
(lab/cluster/controlplane.py); this stays only for what the real server cannot be made to do on
demand, or cannot show:

- a watch that closes at once with nothing received, request after request (the real server
  keeps a watch open until its timeoutSeconds, at least 1 s, and sends bookmarks);
- 410 Gone to every watch, ten times in a row, in a chosen form (an ERROR event in the stream
  or the HTTP answer): the real server answers 410 once its watch cache has moved past the
  client's resourceVersion (after a restart, see test_informer.py), and the form is its choice;
- a relist at the last resourceVersion answered 410 Expired or 504 "Too large resource
  version" (the real server serves such a list from its watch cache, waiting until it is
  fresh enough; "too large" needs an etcd restored to an older revision);
- a watch that sends its headers and then nothing, on a connection that stays up (a dead peer
  without FIN; kube-apiserver sends bookmarks, and stopping it closes the connection);
- an RV=0 list answered in pages, and the exact query of every request (kube-apiserver pages
  such a list only with --watch-cache=false, and shows no client's requests).

Tests assert on how many requests each fault costs and on the backoff between them (with a
fake clock), which needs every request recorded.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from kubernetes import client

Query = dict[str, str]


@dataclass(frozen=True)
class Answer:
    status: int = 200
    body: bytes = b""
    silent: bool = False  # send the headers, then nothing until the test ends


def status_body(code: int, reason: str, message: str, **extra: Any) -> bytes:
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
            **extra,
        }
    ).encode()


def service_list(rv: str, names: list[str], token: str = "") -> Answer:
    meta: dict[str, str] = {"resourceVersion": rv}
    if token:
        meta["continue"] = token
    items = [
        {"metadata": {"name": n, "namespace": "default", "resourceVersion": rv}} for n in names
    ]
    body = {"kind": "ServiceList", "apiVersion": "v1", "metadata": meta, "items": items}
    return Answer(body=json.dumps(body).encode())


def events(*objs: dict[str, Any]) -> Answer:
    return Answer(body=b"".join(json.dumps(o).encode() + b"\n" for o in objs))


GONE_EVENT = {
    "type": "ERROR",
    "object": json.loads(status_body(410, "Expired", "too old resource version: 10 (20)")),
}


class FakeAPI:
    """``answer(query)`` decides each response; ``stop_when(requests)`` is checked after each
    request is recorded and sets ``stop`` (the informer's) when true."""

    def __init__(
        self,
        answer: Callable[[Query], Answer],
        stop: threading.Event,
        stop_when: Callable[[list[Query]], bool] = lambda _r: False,
    ) -> None:
        self.answer = answer
        self.requests: list[Query] = []
        self.lock = threading.Lock()
        self.released = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = {"path": url.path, **dict(parse_qsl(url.query))}
                with fake.lock:
                    fake.requests.append(query)
                    if stop_when(list(fake.requests)):
                        stop.set()
                got = fake.answer(query)
                self.send_response(got.status)
                self.send_header("Content-Type", "application/json")
                if not got.silent:
                    self.send_header("Content-Length", str(len(got.body)))
                self.end_headers()
                self.wfile.write(got.body)
                self.wfile.flush()
                if got.silent:
                    fake.released.wait(60)

            def log_message(self, *_args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def api_client(self) -> Any:
        conf = client.Configuration(host=f"http://127.0.0.1:{self.httpd.server_address[1]}")
        return client.ApiClient(conf)

    def lists(self) -> list[Query]:
        with self.lock:
            return [q for q in self.requests if q.get("watch") != "true"]

    def watches(self) -> list[Query]:
        with self.lock:
            return [q for q in self.requests if q.get("watch") == "true"]

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()
