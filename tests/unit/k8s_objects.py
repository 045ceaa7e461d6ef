"""Builders for Services and EndpointSlices as the API returns them (plain dicts)."""

from __future__ import annotations

from typing import Any


def service(
    name: str,
    cluster_ip: str,
    ports: list[dict[str, Any]] | None = None,
    namespace: str = "default",
    type: str = "ClusterIP",
    labels: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "type": type,
            "clusterIP": cluster_ip,
            "clusterIPs": [cluster_ip],
            "ports": ports or [{"name": "http", "port": 80, "protocol": "TCP"}],
            **spec,
        },
    }
    if status:
        body["status"] = status
    return body


def endpoint(
    ip: str,
    node: str = "node-1",
    ready: bool = True,
    serving: bool | None = None,
    terminating: bool = False,
) -> dict[str, Any]:
    return {
        "addresses": [ip],
        "nodeName": node,
        "conditions": {
            "ready": ready,
            "serving": ready if serving is None else serving,
            "terminating": terminating,
        },
    }


def endpoint_slice(
    service_name: str,
    endpoints: list[dict[str, Any]],
    ports: list[dict[str, Any]] | None = None,
    name: str | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name or f"{service_name}-abc",
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": ports or [{"name": "http", "port": 8080, "protocol": "TCP"}],
    }
