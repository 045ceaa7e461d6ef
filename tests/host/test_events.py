"""Events reach the API server (the lab's, through the official client) and are rate-limited."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client, config

from ipvsproxy.events import EventRecorder
from lab.apiserver import APIServer


def test_warnings_are_posted_once_per_interval(tmp_path: Path) -> None:
    now = [0.0]
    with APIServer() as srv:
        new_client: Any = config.new_client_from_config
        api: Any = client.EventsV1Api(new_client(str(srv.write_kubeconfig(tmp_path / "kc"))))

        def post(ns: str, body: dict[str, Any]) -> None:
            api.create_namespaced_event(ns, body)

        rec = EventRecorder(post, "node-1", interval=60, clock=lambda: now[0])
        assert rec.warn("default/web", "InvalidService", "externalIP 'x' is not an IP address")
        assert not rec.warn("default/web", "InvalidService", "externalIP 'x' is not an IP address")
        assert rec.warn("default/other", "InvalidService", "port 0 out of range")
        now[0] = 61.0
        assert rec.warn("default/web", "InvalidService", "externalIP 'x' is not an IP address")
        rec.queue.join()
        events = api.list_namespaced_event("default").items
        rec.close()
    assert len(events) == 3
    web = [e for e in events if e.regarding.name == "web"]
    assert len(web) == 2
    assert web[0].type == "Warning" and web[0].reason == "InvalidService"
    assert web[0].reporting_controller == "ipvsproxy"
    assert "not an IP address" in web[0].note
