"""A refused operation is retried on its own, with its own backoff, and unrelated changes keep
applying at the usual pace: no full reconcile, no global backoff (issue 13 A3). Over the fake
kernel (``tests.unit.fake_node``); tests/kernel/test_dataplane_containment.py shows it in the
kernel with real traffic."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ipvsproxy.core.desired import Changes
from ipvsproxy.core.virtual_servers import Protocol, ServiceKey
from ipvsproxy.dataplane.dataplane import SyncResult
from ipvsproxy.dataplane.retries import Failures
from tests.unit.fake_node import Node, refuse_ipvs, running_node
from tests.unit.k8s_objects import endpoint, endpoint_slice, service
from tests.unit.test_containment import _proxy


@pytest.fixture
def h(tmp_path: Path) -> Node:
    return running_node(tmp_path)


def test_each_failed_service_backs_off_from_1_s_doubling_to_30_s_and_clears_on_success() -> None:
    now = [100.0]
    f = Failures(lambda: now[0])
    key = ServiceKey("10.96.0.20", Protocol.TCP, 80)
    delays = []
    for _ in range(7):
        f.begin()
        f.fail("default/bad", "refused", Changes(services={key}))
        assert f.end() == {"default/bad": "refused"}
        retry = f.next_retry()
        assert retry is not None
        delays.append(retry - now[0])
        assert f.begin() == Changes()  # not due yet: nothing to retry
        f.end()
        now[0] = retry
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert f.begin() == Changes(services={key})  # due: its keys, and only those
    assert f.end() == {}
    assert f.by_service == {} and f.next_retry() is None


def _wait(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_refused_operation_does_not_hold_up_other_changes(h: Node) -> None:
    proxy = _proxy(h.dp, "--ipvs-sync-period", "1h", "--ipvs-min-sync-period", "0")
    proxy.informers = []
    refuse_ipvs(h.kernel, "10.96.0.20")
    results: list[SyncResult] = []
    sync, reconcile = h.dp.sync, h.dp.reconcile

    def recorded(how: Callable[[], SyncResult]) -> Callable[[], SyncResult]:
        def run() -> SyncResult:
            results.append(how())
            return results[-1]

        return run

    h.dp.sync = recorded(sync)  # type: ignore[method-assign]
    h.dp.reconcile = recorded(reconcile)  # type: ignore[method-assign]
    proxy.on_service("default/bad", None, service("bad", "10.96.0.20"))
    runner = threading.Thread(target=proxy.run, daemon=True)
    runner.start()
    try:
        _wait(lambda: bool(results), "first sync")
        assert "default/bad" in h.dp.failed
        later = service("later", "10.96.0.30")
        sl = endpoint_slice("later", [endpoint("10.244.1.11")])
        proxy.on_service("default/later", None, later)
        proxy.on_slice("default/later-abc", None, sl)
        key = ServiceKey("10.96.0.30", Protocol.TCP, 80)

        def programmed() -> bool:
            obs = h.dp.observed
            return obs is not None and key in obs.services and bool(obs.dests.get(key))

        _wait(programmed, "later programmed")
        # The refused Service is retried on its own backoff meanwhile.
        _wait(lambda: h.dp.failed["default/bad"].attempts >= 3, "bad retried")
    finally:
        proxy.request_stop()
        runner.join(timeout=10)
    assert results[0].full
    assert [r.full for r in results[1:]] == [False] * (len(results) - 1)
    assert all(set(r.failed) <= {"default/bad"} for r in results)
