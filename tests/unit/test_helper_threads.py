"""The daemon's helper threads (the address notices' watch, the --config file's watch, a
server's start retries, the HTTP servers' loop) never end silently: each failure is logged and
counted (``ipvsproxy_helper_failures_total``), and the thread goes on after a pause."""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from pathlib import Path
from typing import Any, cast

import pytest

from ipvsproxy import config
from ipvsproxy.daemon import node
from ipvsproxy.daemon.config_watch import REASON, ConfigWatch
from ipvsproxy.daemon.wiring import start_server
from ipvsproxy.servers import httpserver
from ipvsproxy.servers.metrics import Metrics
from tests.unit.test_daemon_node import Notices, proxy_with

BOUND = 10.0  # a failure bound, not a speed requirement


def failures(metrics: Metrics, helper: str) -> float:
    value = metrics.registry.get_sample_value("ipvsproxy_helper_failures_total", {"helper": helper})
    return value or 0.0


def wait_for(what: Any) -> bool:
    deadline = time.monotonic() + BOUND
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class FailingNotices(Notices):
    """Notices whose socket fails ``failures`` times first (each time opened again)."""

    def __init__(self, proxy: Any, notices: list[set[int] | None], failures: int) -> None:
        super().__init__(proxy, notices)
        self.failures = failures
        self.reopened = 0

    def wait(self, timeout: float) -> set[int] | None:
        if self.failures:
            self.failures -= 1
            raise OSError(errno.EBADF, "Bad file descriptor")
        return super().wait(timeout)

    def reopen(self) -> None:
        self.reopened += 1


def test_the_address_watch_goes_on_after_its_socket_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(node, "NOTICE_RETRY", 0.001)
    proxy, _ = proxy_with([])
    notices = FailingNotices(proxy, [{2}], failures=3)
    with caplog.at_level(logging.WARNING):
        proxy.node.watch_addresses(cast(Any, notices))
    # The notice after the failures still has the addresses read again at the next sync;
    # notices lost meanwhile: re-read too.
    assert proxy.changes.has_work() and proxy.node.addresses_stale.is_set()
    assert notices.reopened >= 1
    assert failures(proxy.metrics, "addresses") == 3
    assert sum("address notices" in r.getMessage() for r in caplog.records) == 3


def test_the_config_watch_goes_on_after_any_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "config.conf"
    path.write_bytes(b"old")
    watch = ConfigWatch(str(path), b"old")
    poll = watch.poll
    broken = [RuntimeError("a bug"), MemoryError()]

    def failing_poll() -> str | None:
        if broken:
            raise broken.pop(0)
        return poll()

    monkeypatch.setattr(watch, "poll", failing_poll)
    stop, stopped = threading.Event(), threading.Event()
    metrics = Metrics()
    with caplog.at_level(logging.ERROR):
        thread = threading.Thread(
            target=watch.run, args=(stop, stopped.set, 0.01, metrics.helper_failed)
        )
        thread.start()
        assert wait_for(lambda: not broken)
        path.write_bytes(b"new")
        assert stopped.wait(BOUND), "the watch ended at its first failure"
    stop.set()
    thread.join(BOUND)
    assert watch.reason == REASON
    assert failures(metrics, "config-watch") == 2
    assert sum("config watch" in r.getMessage() for r in caplog.records) == 2


def test_a_server_start_retry_logs_every_failure(caplog: pytest.LogCaptureFixture) -> None:
    attempts: list[int] = []

    def start() -> None:
        attempts.append(1)
        if len(attempts) <= 4:
            raise OSError(errno.EADDRINUSE, "Address already in use")

    stop = threading.Event()
    metrics = Metrics()
    with caplog.at_level(logging.INFO):
        assert start_server("health", start, False, stop, 0.01, metrics.helper_failed)
        assert wait_for(lambda: any("started" in r.getMessage() for r in caplog.records))
    stop.set()
    cannot = [r for r in caplog.records if "cannot start the health server" in r.getMessage()]
    assert len(cannot) == 4
    assert failures(metrics, "health-server") == 4


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Proxy:
    def status_document(self, kernel: bool = False) -> dict[str, Any]:
        return {"node": "node-1"}


def get(port: int, path: str) -> int:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def test_status_that_cannot_bind_is_retried_on_its_own(caplog: pytest.LogCaptureFixture) -> None:
    """/metrics binds and --status-bind-address does not: /metrics is served, and only the
    status server is tried again (it used to rebind /metrics too, forever and silently)."""
    from ipvsproxy.daemon.wiring import start_servers

    caplog.set_level(logging.INFO)
    metrics_port = free_port()
    stop = threading.Event()
    servers: list[Any] = []
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        status_port = taken.getsockname()[1]
        cfg = config.build(
            None,
            [
                f"--metrics-bind-address=127.0.0.1:{metrics_port}",
                f"--status-bind-address=127.0.0.1:{status_port}",
                "--healthz-bind-address=",
            ],
        )
        started = start_servers(cfg, Metrics(), cast(Any, _Proxy()), stop, retry=0.05)
        assert started is not None
        servers = started
        assert get(metrics_port, "/metrics") == 200
        assert wait_for(lambda: _logged(caplog, "cannot start the status server") >= 2)
    try:
        assert wait_for(lambda: _logged(caplog, "the status server started") == 1)
        assert get(status_port, "/status") == 200
        assert get(metrics_port, "/metrics") == 200
    finally:
        stop.set()
        for server in servers:
            server.close()


def _logged(caplog: pytest.LogCaptureFixture, text: str) -> int:
    return sum(text in r.getMessage() for r in caplog.records)


def test_the_http_loop_goes_on_after_a_failure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    parse = httpserver.parse_request
    broken = [RuntimeError("a bug")]

    def failing(raw: bytes) -> Any:
        if broken:
            raise broken.pop()
        return parse(raw)

    monkeypatch.setattr(httpserver, "parse_request", failing)
    server = httpserver.HTTPServer(
        "127.0.0.1", 0, lambda _p: httpserver.Response(200, "text/plain", b"ok"), "t"
    )
    port = server.server_address[1]
    try:
        with (
            caplog.at_level(logging.ERROR),
            socket.create_connection(("127.0.0.1", port), timeout=5) as s,
        ):
            s.sendall(b"GET / HTTP/1.1\r\n\r\n")
            with contextlib.suppress(ConnectionResetError):
                while s.recv(100):
                    pass
        assert any(r.exc_info for r in caplog.records)
        assert get(port, "/") == 200
    finally:
        server.close()


def test_a_helper_that_raises_is_started_again(caplog: pytest.LogCaptureFixture) -> None:
    """What a helper's own loop does not catch (the address watch's thread runs under it)."""
    from ipvsproxy.daemon.wiring import keep_running

    runs: list[int] = []

    def body() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise RuntimeError("a bug")

    metrics = Metrics()
    with caplog.at_level(logging.ERROR):
        keep_running("addresses", body, threading.Event(), metrics.helper_failed, pause=0.001)
    assert len(runs) == 3
    assert failures(metrics, "addresses") == 2
    assert _logged(caplog, "addresses failed") == 2
