"""Topology-aware routing with real traffic: nodes in two zones, the real EndpointSlice
controller writing hints for ``spec.trafficDistribution``, and hand-written hints for what the
controller does not write (hints that do not cover a zone, a zone label that changes).

Zones: node-1 and node-2 in zone-a, node-3 in zone-b (``topology.kubernetes.io/zone``).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from lab.cluster.kube import POD_ECHO_PORT, LabKube, wait_for
from lab.cluster.kubelet import LabPod
from lab.net import netns
from lab.net.topology import Cluster

pytestmark = pytest.mark.kernel

ZONE = "topology.kubernetes.io/zone"
ZONES = {"node-1": "zone-a", "node-2": "zone-a", "node-3": "zone-b"}


@pytest.fixture(scope="module")
def kube(lab_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabKube]:
    """The control plane with zoned Nodes, every lab pod labelled app=topo, the daemons."""
    lab = LabKube(lab_cluster, tmp_path_factory.mktemp("topology"))
    pods = [
        LabPod(p.name, "default", p.node, p.ip, {"app": "topo"}, {"echo": POD_ECHO_PORT})
        for p in lab_cluster.pods
    ]
    try:
        yield lab.start(pods, {name: {ZONE: zone} for name, zone in ZONES.items()})
    finally:
        print(lab.logs())  # shown with a failure's report
        lab.stop(cleanup=True)


def answers(ns: str, ip: str, n: int = 16) -> set[str]:
    out = set()
    for _ in range(n):
        try:
            out.add(netns.tcp_request(ns, ip, 80, timeout=2)["pod"])
        except OSError:
            out.add("(no answer)")
    return out


def pods_on(cluster: Cluster, *nodes: str) -> set[str]:
    return {p.name for p in cluster.pods if p.node in nodes}


def client_ns(cluster: Cluster, node: str) -> str:
    return next(n for n in cluster.nodes if n.name == node).pods[-1].netns


def test_traffic_distribution_keeps_traffic_in_the_zone_then_on_the_node(
    lab_cluster: Cluster, kube: LabKube
) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(kube.api)
    disc: Any = client.DiscoveryV1Api(kube.api)
    core.create_namespaced_service(
        "default",
        {
            "metadata": {"name": "zoned"},
            "spec": {
                "selector": {"app": "topo"},
                "ports": [{"name": "http", "port": 80, "targetPort": "echo"}],
                "trafficDistribution": "PreferSameZone",
            },
        },
    )
    vip = core.read_namespaced_service("zoned", "default").spec.cluster_ip

    def hinted(kind: str) -> bool:
        items = disc.list_namespaced_endpoint_slice(
            "default", label_selector="kubernetes.io/service-name=zoned"
        ).items
        eps = [e for s in items for e in s.endpoints or []]
        return len(eps) == len(lab_cluster.pods) and all(
            e.hints is not None and getattr(e.hints, kind) for e in eps
        )

    wait_for(lambda: hinted("for_zones"), 30, "the controller's zone hints")
    zone_a = pods_on(lab_cluster, "node-1", "node-2")
    # A pod in zone-a reaches zone-a's four pods only; one in zone-b its zone's two.
    wait_for(lambda: answers(client_ns(lab_cluster, "node-1"), vip) == zone_a, 30, "zone-a")
    wait_for(
        lambda: answers(client_ns(lab_cluster, "node-3"), vip) == pods_on(lab_cluster, "node-3"),
        30,
        "zone-b",
    )
    # The node itself is a client in its zone too.
    wait_for(lambda: answers(lab_cluster.nodes[1].netns, vip) == zone_a, 30, "node-2 itself")
    core.patch_namespaced_service(
        "zoned", "default", {"spec": {"trafficDistribution": "PreferSameNode"}}
    )
    wait_for(lambda: hinted("for_nodes"), 30, "the controller's node hints")
    for name in ("node-1", "node-3"):
        ns, want = client_ns(lab_cluster, name), pods_on(lab_cluster, name)
        wait_for(partial(lambda ns, want: answers(ns, vip) == want, ns, want), 30, name)
    core.delete_namespaced_service("zoned", "default")


def hinted_slice(cluster: Cluster, zones: dict[str, str]) -> dict[str, Any]:
    """One endpoint per named pod, hinted for the zone given."""
    pods = {p.name: p for p in cluster.pods}
    return {
        "metadata": {"name": "hinted-1", "labels": {"kubernetes.io/service-name": "hinted"}},
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": [pods[name].ip],
                "nodeName": pods[name].node,
                "conditions": {"ready": True},
                "hints": {"forZones": [{"name": zone}]},
            }
            for name, zone in zones.items()
        ],
        "ports": [{"name": "http", "port": POD_ECHO_PORT, "protocol": "TCP"}],
    }


def test_hints_that_miss_the_zone_fall_back_and_a_zone_label_change_is_followed(
    lab_cluster: Cluster, kube: LabKube
) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(kube.api)
    disc: Any = client.DiscoveryV1Api(kube.api)
    core.create_namespaced_service(
        "default",
        {"metadata": {"name": "hinted"}, "spec": {"ports": [{"name": "http", "port": 80}]}},
    )
    vip = core.read_namespaced_service("hinted", "default").spec.cluster_ip
    first = {n.name: n.pods[0].name for n in lab_cluster.nodes}
    zones = {first["node-1"]: "zone-a", first["node-2"]: "zone-a", first["node-3"]: "zone-c"}
    disc.create_namespaced_endpoint_slice("default", hinted_slice(lab_cluster, zones))
    in_zone_a = {first["node-1"], first["node-2"]}
    wait_for(lambda: answers(client_ns(lab_cluster, "node-1"), vip) == in_zone_a, 30, "zone-a")
    # No endpoint is hinted for zone-b: node-3's clients reach every endpoint.
    wait_for(lambda: answers(client_ns(lab_cluster, "node-3"), vip) == set(zones), 30, "fallback")
    # node-3 moves to zone-c: its daemon follows the label, without the slice changing.
    core.patch_node("node-3", {"metadata": {"labels": {ZONE: "zone-c"}}})
    want = {first["node-3"]}
    wait_for(lambda: answers(client_ns(lab_cluster, "node-3"), vip) == want, 30, "zone-c")
    assert answers(client_ns(lab_cluster, "node-1"), vip) == in_zone_a
    core.patch_node("node-3", {"metadata": {"labels": {ZONE: "zone-b"}}})
    core.delete_namespaced_service("hinted", "default")
