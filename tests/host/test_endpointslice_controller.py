"""The lab's EndpointSlice controller, against the lab API server on the host."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from lab.apiserver import APIServer
from lab.endpointslice_controller import SERVICES, SLICES, EndpointSliceController, LabPod


@pytest.fixture
def server() -> Iterator[APIServer]:
    with APIServer(host="127.0.0.1", port=0, bookmark_interval=1.0) as srv:
        yield srv


def service(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }


def slices_of(server: APIServer, name: str) -> list[dict[str, Any]]:
    return [
        s
        for s in server.store.values(SLICES.storage)
        if (s["metadata"].get("labels") or {}).get("kubernetes.io/service-name") == name
    ]


def test_a_service_created_during_a_pass_gets_its_slice(server: APIServer) -> None:
    """A write that lands while the controller computes slices is seen by a later pass (the
    demo once lost a Service created at that moment: its slice never came)."""
    controller = EndpointSliceController(server, resync=0.2)
    controller.add_pod(LabPod("pod-1", "default", "node-1", "10.244.1.11", {"app": "web"}))
    server.ops.create(SERVICES, "default", service("first"))
    real_reconcile = controller.reconcile
    created: list[str] = []

    def reconcile_racing_a_write() -> int:
        writes = real_reconcile()
        if not created:  # the write arrives just after this pass read the store
            created.append("late")
            server.ops.create(SERVICES, "default", service("late"))
        return writes

    controller.reconcile = reconcile_racing_a_write  # type: ignore[method-assign]
    controller.start()
    try:
        deadline = time.monotonic() + 5
        while not slices_of(server, "late") and time.monotonic() < deadline:
            time.sleep(0.05)
        (late,) = slices_of(server, "late")
        assert [e["addresses"] for e in late["endpoints"]] == [["10.244.1.11"]]
        assert len(slices_of(server, "first")) == 1
    finally:
        controller.stop()
