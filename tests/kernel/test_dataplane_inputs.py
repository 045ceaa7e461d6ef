"""Inputs that real clusters send, through the real dataplane with real traffic: a /0 source
range, endpoint addresses the kernel refuses, two Services claiming one virtual server, and
externalTrafficPolicy Local without a local endpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lab import netns
from lab.topology import Cluster
from tests.host.k8s_objects import endpoint, endpoint_slice, service
from tests.kernel.dataplane_helpers import NodeDataplane, node_dataplane, sh
from tests.kernel.test_dataplane_services import np_service, routes_to_node1

pytestmark = pytest.mark.kernel
__all__ = ["routes_to_node1"]  # a fixture, used by name


def apply(ndp: NodeDataplane, *services: tuple[str, dict[str, Any] | None, list[Any]]) -> Any:
    """Update each (namespace/name, Service or None, slices) and sync; the sync's result."""

    def run(dp: Any) -> Any:
        for name, svc, slices in services:
            dp.update_service(name, svc, slices)
        return dp.sync()

    return ndp.run(run)


def real_servers(cluster: Cluster, ns: str, vip: str, port: int = 80) -> list[str]:
    table = sh(cluster, ns, f"ipvsadm -Ln -t {vip}:{port}")
    rows = [line.split() for line in table.splitlines() if line.strip().startswith("->")]
    return sorted(row[1] for row in rows if row[1] != "RemoteAddress:Port")


def test_source_range_of_everyone_admits_everyone(
    lab_cluster: Cluster, tmp_path: Path, routes_to_node1: None
) -> None:
    """loadBalancerSourceRanges 0.0.0.0/0 (a common value): the kernel refuses a /0 in a
    hash:ip,port,net set, so a /0 must mean what it says, no filter at all (upstream #132722)."""
    n1 = lab_cluster.node("node-1")
    sl = endpoint_slice("all", [endpoint(n1.pods[0].ip, "node-1")])

    def lb(ranges: list[str]) -> dict[str, Any]:
        status = {"loadBalancer": {"ingress": [{"ip": "203.0.113.20"}]}}
        return np_service(
            "all",
            "10.96.2.1",
            30092,
            type="LoadBalancer",
            loadBalancerSourceRanges=ranges,
            status=status,
        )

    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        for ranges in (["0.0.0.0/0"], ["10.0.0.0/8", "0.0.0.0/0"], ["192.0.2.1/0"]):
            result = apply(ndp, ("default/all", lb(ranges), [sl]))
            assert result.errors == [], ranges
            a = netns.tcp_request("external", "203.0.113.20", 80, timeout=3)
            assert a["pod"] == "pod-1-1", ranges
        # A real range still filters.
        apply(ndp, ("default/all", lb(["10.0.0.0/8"]), [sl]))
        with pytest.raises(OSError):
            netns.tcp_request("external", "203.0.113.20", 80, timeout=2)


def test_endpoint_addresses_the_kernel_refuses_are_skipped_the_others_serve(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    n1 = lab_cluster.node("node-1")
    good = [n1.pods[0], lab_cluster.node("node-2").pods[0]]
    odd = ["224.0.0.5", "255.255.255.255", "0.0.0.0", "fd00::1", "010.1.1.1"]
    eps = [endpoint(p.ip, p.node) for p in good] + [endpoint(ip, "node-3") for ip in odd]
    slices = [
        endpoint_slice("odd", eps, name="odd-a"),
        # A port outside 1..65535 (the API server does not check a slice's ports).
        endpoint_slice(
            "odd",
            [endpoint(lab_cluster.node("node-3").pods[0].ip, "node-3")],
            ports=[{"name": "http", "port": 70000, "protocol": "TCP"}],
            name="odd-b",
        ),
    ]
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        result = apply(ndp, ("default/odd", service("odd", "10.96.2.2"), slices))
        assert result.errors == []
        warning = ndp.dp.errors["default/odd"]
        for what in [*odd, "70000"]:
            assert what in warning
        assert real_servers(lab_cluster, n1.netns, "10.96.2.2") == sorted(
            f"{p.ip}:8080" for p in good
        )
        answers = {netns.tcp_request(n1.pods[1].netns, "10.96.2.2", 80)["pod"] for _ in range(6)}
        assert answers == {p.name for p in good}
