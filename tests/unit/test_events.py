"""Events reach the real kube-apiserver (through the official client), pass its validation of
events.k8s.io/v1, and are rate-limited."""

from __future__ import annotations

from typing import Any

from kubernetes import client, config

from ipvsproxy.kube.events import EventRecorder
from lab.cluster.controlplane import ControlPlane


def test_warnings_are_posted_once_per_interval(controlplane: ControlPlane) -> None:
    now = [0.0]
    new_client: Any = config.new_client_from_config
    api_client = new_client(str(controlplane.kubeconfig))
    api: Any = client.EventsV1Api(api_client)
    ns = "events-test"
    core: Any = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": ns}})

    def post(ns: str, body: dict[str, Any]) -> None:
        api.create_namespaced_event(ns, body)

    rec = EventRecorder(post, "node-1", interval=60, clock=lambda: now[0])
    assert rec.warn(f"{ns}/web", "InvalidService", "externalIP 'x' is not an IP address")
    assert not rec.warn(f"{ns}/web", "InvalidService", "externalIP 'x' is not an IP address")
    assert rec.warn(f"{ns}/other", "InvalidService", "port 0 out of range")
    now[0] = 61.0
    assert rec.warn(f"{ns}/web", "InvalidService", "externalIP 'x' is not an IP address")
    rec.queue.join()
    events = api.list_namespaced_event(ns).items
    rec.close()
    assert len(events) == 3
    web = [e for e in events if e.regarding.name == "web"]
    assert len(web) == 2
    assert web[0].type == "Warning" and web[0].reason == "InvalidService"
    assert web[0].reporting_controller == "ipvsproxy"
    assert "not an IP address" in web[0].note
