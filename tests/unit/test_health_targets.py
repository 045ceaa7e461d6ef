"""What each externalTrafficPolicy Local Service's healthCheckNodePort answers on this node:
the count of its ready endpoints here (upstream's ServiceHealthServer input)."""

from __future__ import annotations

from typing import Any

from ipvsproxy.daemon.targets import health_check_targets
from ipvsproxy.servers.service_health import Target
from tests.unit.k8s_objects import endpoint, endpoint_slice, service


def _local(name: str, port: int, **spec: Any) -> dict[str, Any]:
    return service(
        name,
        "10.96.0.10",
        type="LoadBalancer",
        externalTrafficPolicy="Local",
        healthCheckNodePort=port,
        **spec,
    )


def test_local_endpoints_are_counted_per_health_check_node_port() -> None:
    services = {
        "default/web": _local("web", 31289),
        "default/none": _local("none", 31290),
        "default/cluster": service("cluster", "10.96.0.11", type="LoadBalancer"),
    }
    slices = {
        "default/web": {
            "default/web-a": endpoint_slice(
                "web",
                [
                    endpoint("10.244.1.11"),
                    endpoint("10.244.1.12", ready=False),  # not counted
                    endpoint("10.244.2.11", node="node-2"),  # another node's
                ],
            ),
            "default/web-b": endpoint_slice("web", [endpoint("10.244.1.11")], name="web-b"),
        },
        "default/none": {
            "default/none-a": endpoint_slice("none", [endpoint("10.244.2.12", "node-2")])
        },
    }
    assert health_check_targets(services, slices, "node-1") == {
        31289: Target("default/web", 1),  # the same address in two slices: one endpoint
        31290: Target("default/none", 0),
    }


def test_cluster_policy_or_no_port_has_no_target() -> None:
    services = {
        "default/cluster": service(
            "cluster", "10.96.0.11", type="LoadBalancer", healthCheckNodePort=31291
        ),
        "default/portless": _local("portless", 0),
    }
    assert health_check_targets(services, {}, "node-1") == {}
