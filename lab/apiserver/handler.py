"""HTTP: routing of the Kubernetes REST paths to the verbs, and the wire format of answers.

Every answer is JSON with a Content-Length, except a watch, which is HTTP/1.1 chunked with one
event per line, as the real server streams it. Any failure becomes a Status object: an
APIError as itself, anything unexpected as a logged 500, so a bad request never takes the
server down.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING, Any

from lab.apiserver import discovery, errors, listing, openapi, ops, protobuf, tables, watch
from lab.apiserver.meta import JSON
from lab.apiserver.resources import ResourceType, lookup

if TYPE_CHECKING:
    from lab.apiserver.server import APIServer

log = logging.getLogger("lab.apiserver")
_HEALTH = ("/healthz", "/livez", "/readyz")


@dataclass(frozen=True)
class Target:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None
    watch_path: bool


def _split(path: str) -> list[str]:
    return [urllib.parse.unquote(p) for p in path.split("/") if p]


def parse_target(parts: list[str]) -> Target | None:
    """Map /api/v1/... or /apis/GROUP/VERSION/... to a resource, namespace, name, subresource."""
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    watch_path = rest[0] == "watch"
    if watch_path:
        rest = rest[1:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rt = lookup(group, version, rest[2])
        if rt is not None and rt.namespaced:
            if len(rest) > 5:
                return None
            return _checked(Target(rt, rest[1], _at(rest, 3), _at(rest, 4), watch_path))
    if not rest or len(rest) > 3:
        return None
    rt = lookup(group, version, rest[0])
    if rt is None:
        return None
    if rt.namespaced and len(rest) > 1:
        return None
    return _checked(Target(rt, None, _at(rest, 1), _at(rest, 2), watch_path))


def _at(parts: list[str], index: int) -> str | None:
    return parts[index] if index < len(parts) else None


def _checked(target: Target) -> Target | None:
    if target.subresource is not None and target.subresource not in target.rt.subresources:
        return None
    return target


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "lab-apiserver"
    # An idle keep-alive connection is dropped after this long, freeing its thread.
    timeout = 300

    @property
    def app(self) -> APIServer:
        return self.server.app  # type: ignore[attr-defined, no-any-return]

    def setup(self) -> None:
        """No Nagle: headers and body go in separate writes, and waiting for the client's
        delayed ACK between them would add 40 ms to every request."""
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - %s", self.address_string(), format % args)

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_PATCH(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def do_OPTIONS(self) -> None:
        self._handle()

    def do_HEAD(self) -> None:
        self._handle()

    def _handle(self) -> None:
        self._streaming = False
        try:
            self.body = self._read_body()
            self._route()
        except errors.APIError as exc:
            self._reply_error(exc)
        except OSError:
            self.close_connection = True
        except Exception as exc:
            log.exception("lab apiserver: %s %s failed", self.command, self.path)
            self._reply_error(errors.internal(f"{type(exc).__name__}: {exc}"))

    def _reply_error(self, exc: errors.APIError) -> None:
        if self._streaming:
            self.close_connection = True
            return
        try:
            self.send_json(exc.code, exc.status())
        except OSError:
            self.close_connection = True

    def json_body(self) -> Any:
        """The request body of a create or update, which must be JSON (or untyped)."""
        media = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if media == protobuf.MEDIA_TYPE:
            return protobuf.decode(self.body)
        if media not in ("", "application/json", "*/*"):
            raise errors.unsupported_media_type(["application/json", protobuf.MEDIA_TYPE])
        return ops.decode_json(self.body)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def send_json(self, code: int, obj: Any) -> None:
        data = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def send_text(self, code: int, text: str) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _route(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        self.params = {
            k: v[0] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()
        }
        parts = _split(url.path)
        if self._route_fixed(url.path.rstrip("/") or "/", parts):
            return
        target = parse_target(parts)
        if target is None:
            raise errors.path_not_found()
        self._resource(target)

    def _route_fixed(self, path: str, parts: list[str]) -> bool:
        """Discovery, version, health and the lab's own endpoints; False for resource paths."""
        if path.startswith(_HEALTH) and self.command in ("GET", "HEAD"):
            self.send_text(200, "ok")
        elif path == "/version":
            self.send_json(200, discovery.VERSION)
        elif path == "/lab/compact" and self.command == "POST":
            self.send_json(200, {"resourceVersion": str(self.app.compact())})
        elif path == "/api":
            self.send_json(200, discovery.api_versions(f"{self.app.host}:{self.app.port}"))
        elif path == "/apis":
            self.send_json(200, discovery.group_list())
        elif len(parts) == 2 and parts[0] == "apis":
            self._send_found(discovery.group(parts[1]))
        elif (len(parts) == 2 and parts[0] == "api") or (len(parts) == 3 and parts[0] == "apis"):
            group = parts[1] if parts[0] == "apis" else ""
            self._send_found(discovery.resource_list(group, parts[-1]))
        elif path == "/openapi/v3":
            self.send_json(200, openapi.root())
        elif parts[:2] == ["openapi", "v3"]:
            self._send_found(openapi.lookup(parts))
        elif path == "/":
            self.send_json(200, {"paths": ["/api", "/api/v1", "/apis", "/healthz", "/version"]})
        else:
            return False
        return True

    def _send_found(self, doc: JSON | None) -> None:
        if doc is None:
            raise errors.path_not_found()
        self.send_json(200, doc)

    @property
    def dry_run(self) -> bool:
        return self.params.get("dryRun") == "All"

    def _resource(self, t: Target) -> None:
        if t.name is None:
            self._collection(t)
        elif t.subresource is not None:
            self._subresource(t)
        else:
            self._object(t)

    def _collection(self, t: Target) -> None:
        verbs = self.app.ops
        flt = (
            listing.parse_filter(t.rt, t.namespace, self.params)
            if self.command in ("GET", "DELETE")
            else None
        )
        if self.command == "GET" and flt is not None:
            if t.watch_path or self.params.get("watch", "").lower() in ("true", "1"):
                self._watch(flt)
            else:
                self._list(t.rt, flt)
        elif t.rt.namespaced and t.namespace is None:
            raise errors.method_not_allowed()
        elif self.command == "POST":
            created = verbs.create(t.rt, t.namespace, self.json_body(), self.dry_run)
            self.send_json(201, created)
        elif self.command == "DELETE" and "deletecollection" in t.rt.verbs and flt is not None:
            self.send_json(
                200,
                verbs.delete_collection(t.rt, t.namespace, flt.labels, flt.fields, self.dry_run),
            )
        else:
            raise errors.method_not_allowed()

    def _object(self, t: Target) -> None:
        verbs, name = self.app.ops, t.name or ""
        if self.command == "GET" and t.watch_path:
            selector = f"metadata.name={name}"
            self.params["fieldSelector"] = ",".join(
                filter(None, [self.params.get("fieldSelector"), selector])
            )
            self._watch(listing.parse_filter(t.rt, t.namespace, self.params))
        elif self.command in ("GET", "HEAD"):
            self._send_object(t.rt, verbs.get(t.rt, t.namespace, name))
        elif self.command == "PUT":
            obj, created = verbs.update(
                t.rt, t.namespace, name, self.json_body(), None, self.dry_run
            )
            self.send_json(201 if created else 200, obj)
        elif self.command == "PATCH":
            content_type = self.headers.get("Content-Type", "")
            self.send_json(
                200,
                verbs.patch(t.rt, t.namespace, name, content_type, self.body, None, self.dry_run),
            )
        elif self.command == "DELETE":
            options = ops.decode_json(self.body) if self.body.strip() else {}
            self.send_json(200, verbs.delete(t.rt, t.namespace, name, options, self.dry_run))
        else:
            raise errors.method_not_allowed()

    def _subresource(self, t: Target) -> None:
        verbs, name = self.app.ops, t.name or ""
        if self.command == "GET":
            self.send_json(200, verbs.get(t.rt, t.namespace, name))
        elif self.command == "PUT":
            body = self.json_body()
            obj, _ = verbs.update(t.rt, t.namespace, name, body, t.subresource, self.dry_run)
            self.send_json(200, obj)
        elif self.command == "PATCH":
            content_type = self.headers.get("Content-Type", "")
            obj = verbs.patch(
                t.rt, t.namespace, name, content_type, self.body, t.subresource, self.dry_run
            )
            self.send_json(200, obj)
        else:
            raise errors.method_not_allowed()

    def _include(self) -> str:
        return self.params.get("includeObject") or "Metadata"

    def _send_object(self, rt: ResourceType, obj: JSON) -> None:
        if tables.wants_table(self.headers.get("Accept", "")):
            stored = rt.to_storage(obj)
            md = {"resourceVersion": obj.get("metadata", {}).get("resourceVersion", "")}
            self.send_json(200, tables.table(rt, [stored], md, self._include()))
        else:
            self.send_json(200, obj)

    def _list(self, rt: ResourceType, flt: listing.Filter) -> None:
        result = listing.list_objects(self.app.store, flt, self.params)
        if tables.wants_table(self.headers.get("Accept", "")):
            stored = [rt.to_storage(item) for item in result["items"]]
            self.send_json(200, tables.table(rt, stored, result["metadata"], self._include()))
        else:
            self.send_json(200, result)

    def _watch(self, flt: listing.Filter) -> None:
        store = self.app.store
        req = watch.parse_request(store, flt, self.params)
        try:
            watcher = watch.open_watcher(store, req)
        except errors.APIError as exc:
            if exc.code != 410:
                raise
            self._start_stream()
            self._chunk(watch.error_event(exc))
            self._end_stream()
            return
        self._start_stream()
        watch.serve(store, watcher, req, _Sink(self), self.app.bookmark_interval)
        self._end_stream()

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        self._streaming = True

    def _chunk(self, event: JSON) -> None:
        data = json.dumps(event, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self._streaming = False
        if self.app.stopping:
            self.close_connection = True

    def client_gone(self) -> bool:
        """A watch client that hung up shows as a readable socket with nothing to read."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            peeked: bytes = self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            return peeked == b""
        except (OSError, ValueError):
            return True


class _Sink:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    def send(self, event: JSON) -> None:
        self.handler._chunk(event)

    def alive(self) -> bool:
        return not self.handler.client_gone() and not self.handler.app.stopping
