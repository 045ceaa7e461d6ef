"""The dataplane's bookkeeping of Service updates (no kernel: nothing is synced here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.core.desired import Changes
from ipvsproxy.core.plan import NodeFacts
from ipvsproxy.core.virtual_servers import Protocol, ServiceKey
from ipvsproxy.dataplane.dataplane import Backends, Dataplane
from tests.unit.k8s_objects import endpoint, endpoint_slice, service


def dataplane(tmp_path: Path) -> Dataplane:
    unused: Any = None  # update_service never touches the kernel
    return Dataplane(NodeFacts("node-1"), Backends(*[unused] * 6), tmp_path / "state.json")


def test_an_invalid_update_keeps_the_last_good_plan_and_says_why(tmp_path: Path) -> None:
    dp = dataplane(tmp_path)
    sl = endpoint_slice("web", [endpoint("10.244.1.11")])
    assert dp.update_service("default/web", service("web", "10.96.0.10"), [sl]) is None
    key = ServiceKey("10.96.0.10", Protocol.TCP, 80)
    assert key in dp.desired.virtual_servers
    dp.pending = Changes()  # as after a sync
    bad = service("web", "10.96.0.10", ports=[{"name": "http", "port": 80, "protocol": "ICMP"}])
    error = dp.update_service("default/web", bad, [sl])
    assert error is not None and "default/web" in error and "protocol" in error
    assert dp.errors == {"default/web": error}
    assert key in dp.desired.virtual_servers  # still programmed as before
    assert not dp.pending  # nothing to do
    # Fixed again: the error goes away.
    assert dp.update_service("default/web", service("web", "10.96.0.10"), [sl]) is None
    assert dp.errors == {}


def test_deleting_a_service_removes_its_plan(tmp_path: Path) -> None:
    dp = dataplane(tmp_path)
    dp.update_service("default/web", service("web", "10.96.0.10"), [])
    dp.pending = Changes()  # as after a sync: the add is done
    dp.update_service("default/web", None, [])
    assert dp.desired.virtual_servers == {}
    assert dp.pending.services == {ServiceKey("10.96.0.10", Protocol.TCP, 80)}
    assert dp.pending.addresses == {"10.96.0.10"}


def test_chunks_go_on_after_a_rejected_one_and_report_all_rejections() -> None:
    from ipvsproxy.dataplane.batching import apply_chunks, chunked
    from ipvsproxy.kernel.errors import ApplyError, Rejected

    seen: list[list[int]] = []

    def apply(chunk: list[int]) -> int:
        seen.append(chunk)
        bad = [i for i in chunk if i % 5 == 0]
        if bad:
            raise ApplyError([Rejected(f"op {i}", 17) for i in bad], len(chunk) - len(bad))
        return len(chunk)

    with pytest.raises(ApplyError) as exc:
        apply_chunks(chunked(list(range(1, 13)), 4), apply)
    assert seen == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
    assert [r.what for r in exc.value.rejected] == ["op 5", "op 10"]
    assert exc.value.applied == 10
    apply_chunks(chunked([1, 2, 3], 2), apply)  # nothing rejected: nothing raised


def test_an_invalid_service_keeps_following_its_endpoints(tmp_path: Path) -> None:
    """While a Service's spec is invalid its last good spec stays programmed, and its real
    servers still follow the EndpointSlices: pods are replaced and their IPs reused meanwhile
    (issue 13 B10)."""
    dp = dataplane(tmp_path)
    key = ServiceKey("10.96.0.10", Protocol.TCP, 80)
    old = endpoint_slice("web", [endpoint("10.244.1.11")])
    assert dp.update_service("default/web", service("web", "10.96.0.10"), [old]) is None
    dp.pending = Changes()  # as after a sync
    icmp = [{"name": "http", "port": 80, "protocol": "ICMP"}]
    bad = service("web", "10.96.0.10", ports=icmp, externalIPs=["198.51.100.99"])
    assert dp.update_service("default/web", bad, [old]) is not None
    new = endpoint_slice("web", [endpoint("10.244.1.12"), endpoint("10.244.2.13", "node-2")])
    error = dp.update_service("default/web", bad, [new])
    assert error is not None and "protocol" in error
    assert dp.errors == {"default/web": error}  # still reported as invalid
    assert {d.address for d in dp.desired.real_servers[key]} == {"10.244.1.12", "10.244.2.13"}
    assert key in dp.pending.services
    assert "198.51.100.99" not in dp.desired.bind_refs  # the bad edit itself is not programmed


@pytest.mark.parametrize("content", ["", "{", '{"version": 99}'])
def test_an_unreadable_state_file_falls_back_to_the_kernel_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str
) -> None:
    (tmp_path / "state.json").write_text(content)
    dp = dataplane(tmp_path)  # start-up and `ipvsproxy cleanup` construct it: no exception
    assert dp.state.virtual_servers == set()
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert "state.json is unreadable" in warning.message and "kube-ipvs0" in warning.message


def test_a_failed_state_write_is_logged_and_counted_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import errno
    import os

    from ipvsproxy.dataplane.statefile import StateFile

    dp = dataplane(tmp_path)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    dp.update_service("default/web", service("web", "10.96.0.10"), [])
    dp._save_state()  # the end of every sync: must not raise
    dp._save_state()
    assert dp.state_write_failures == 2
    warnings = [r.message for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "No space left on device" in warnings[0]  # said once
    monkeypatch.undo()
    dp._save_state()
    assert dp.state_write_failures == 2
    assert StateFile(tmp_path / "state.json").load().identities.keys() == {"default/web"}
