"""Topology-aware routing: the planner's choice of endpoints from EndpointSlice hints, as
upstream's CategorizeEndpoints (pkg/proxy/topology_test.go's cases, at the planner's level)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from ipvsproxy.core import identities
from ipvsproxy.core.plan import NodeFacts, PlanConfig, ServicePlan, plan_service
from ipvsproxy.core.topology import Hints, hints_of
from ipvsproxy.core.virtual_servers import Protocol, ServiceKey
from ipvsproxy.kube import slim
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

NODE = NodeFacts(
    name="node-1",
    node_ips=("192.168.56.11",),
    local_addresses=frozenset({"192.168.56.11"}),
    primary_ip="192.168.56.11",
    zone="zone-a",
)
CLUSTER_IP = ServiceKey("10.96.0.10", Protocol.TCP, 80)
NODE_PORT = ServiceKey("192.168.56.11", Protocol.TCP, 30080)


def ep(
    ip: str,
    node: str = "node-2",
    zones: tuple[str, ...] | None = None,
    nodes: tuple[str, ...] | None = None,
    **conditions: Any,
) -> dict[str, Any]:
    e = endpoint(ip, node=node, **conditions)
    hints: dict[str, Any] = {}
    if zones is not None:
        hints["forZones"] = [{"name": z} for z in zones]
    if nodes is not None:
        hints["forNodes"] = [{"name": n} for n in nodes]
    if hints:
        e["hints"] = hints
    return e


def plan(
    *eps: dict[str, Any], node: NodeFacts = NODE, slim_it: bool = False, **spec: Any
) -> ServicePlan:
    svc: Mapping[str, Any] = service("web", "10.96.0.10", **spec)
    sl: Mapping[str, Any] = endpoint_slice("web", list(eps))
    if slim_it:
        svc, sl = slim.service(svc), slim.endpoint_slice(sl)
    return plan_service(svc, [sl], node, PlanConfig())


def chosen(p: ServicePlan, key: ServiceKey = CLUSTER_IP) -> tuple[list[str], str]:
    addresses = sorted(d.address for d in p.real_servers[key])
    return addresses, p.identity.virtual_servers[key].topology


ZONED = (
    ep("10.0.0.1", zones=("zone-a",)),
    ep("10.0.0.2", zones=("zone-b",)),
    ep("10.0.0.3", zones=("zone-c",)),
    ep("10.0.0.4", zones=("zone-a",)),
)


@pytest.mark.parametrize("slim_it", [False, True])
def test_zone_hints_for_this_zone_keep_its_endpoints(slim_it: bool) -> None:
    assert chosen(plan(*ZONED, slim_it=slim_it)) == (
        ["10.0.0.1", "10.0.0.4"],
        identities.TOPOLOGY_SAME_ZONE,
    )


def test_a_node_without_a_zone_label_ignores_zone_hints() -> None:
    p = plan(*ZONED, node=replace(NODE, zone=""))
    assert chosen(p) == (["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"], "Cluster")


def test_zone_hints_that_do_not_cover_this_zone_are_ignored() -> None:
    p = plan(*ZONED, node=replace(NODE, zone="zone-d"))
    assert chosen(p) == (["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"], "Cluster")


def test_one_ready_endpoint_without_hints_turns_topology_off() -> None:
    p = plan(*ZONED, ep("10.0.0.5"))
    assert chosen(p)[1] == identities.TOPOLOGY_CLUSTER
    assert len(chosen(p)[0]) == 5


def test_an_unready_endpoint_without_hints_does_not_turn_topology_off() -> None:
    p = plan(*ZONED, ep("10.0.0.5", ready=False))
    assert chosen(p) == (["10.0.0.1", "10.0.0.4"], identities.TOPOLOGY_SAME_ZONE)


def test_only_unready_endpoints_hinted_for_this_zone_do_not_filter() -> None:
    p = plan(
        ep("10.0.0.1", zones=("zone-a",), ready=False),
        ep("10.0.0.2", zones=("zone-b",)),
        ep("10.0.0.3", zones=("zone-c",)),
    )
    assert chosen(p) == (["10.0.0.2", "10.0.0.3"], identities.TOPOLOGY_CLUSTER)


def test_node_hints_for_this_node_keep_its_endpoints() -> None:
    p = plan(
        ep("10.0.0.1", node="node-1", zones=("zone-a",), nodes=("node-1",)),
        ep("10.0.0.2", node="node-2", zones=("zone-a",), nodes=("node-2",)),
        ep("10.0.0.3", node="node-3", zones=("zone-b",), nodes=("node-3",)),
    )
    assert chosen(p) == (["10.0.0.1"], identities.TOPOLOGY_SAME_NODE)


def test_node_hints_not_for_this_node_fall_back_to_zone_hints() -> None:
    p = plan(
        ep("10.0.0.2", node="node-2", zones=("zone-a",), nodes=("node-2",)),
        ep("10.0.0.3", node="node-3", zones=("zone-b",), nodes=("node-3",)),
    )
    assert chosen(p) == (["10.0.0.2"], identities.TOPOLOGY_SAME_ZONE)


def test_node_hints_on_some_endpoints_only_fall_back_to_zone_hints() -> None:
    p = plan(
        ep("10.0.0.1", node="node-1", zones=("zone-a",), nodes=("node-1",)),
        ep("10.0.0.2", node="node-2", zones=("zone-a",)),
        ep("10.0.0.3", node="node-3", zones=("zone-b",)),
    )
    assert chosen(p) == (["10.0.0.1", "10.0.0.2"], identities.TOPOLOGY_SAME_ZONE)


def test_no_ready_endpoint_falls_back_to_serving_terminating_ones_of_any_zone() -> None:
    p = plan(
        ep("10.0.0.1", zones=("zone-a",), ready=False, serving=True, terminating=True),
        ep("10.0.0.2", zones=("zone-b",), ready=False, serving=True, terminating=True),
        ep("10.0.0.3", zones=("zone-a",), ready=False, serving=False, terminating=True),
    )
    assert chosen(p) == (["10.0.0.1", "10.0.0.2"], identities.TOPOLOGY_CLUSTER)


def test_internal_traffic_policy_local_ignores_topology() -> None:
    p = plan(
        ep("10.0.0.1", node="node-1", zones=("zone-b",)),
        ep("10.0.0.2", node="node-2", zones=("zone-a",)),
        internalTrafficPolicy="Local",
    )
    assert chosen(p) == (["10.0.0.1"], identities.TOPOLOGY_LOCAL)


def test_external_traffic_policy_local_ignores_topology_for_external_traffic_only() -> None:
    p = plan(
        ep("10.0.0.1", node="node-1", zones=("zone-b",)),
        ep("10.0.0.2", node="node-2", zones=("zone-a",)),
        type="NodePort",
        ports=[{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}],
        externalTrafficPolicy="Local",
    )
    assert chosen(p, NODE_PORT) == (["10.0.0.1"], identities.TOPOLOGY_LOCAL)
    assert chosen(p) == (["10.0.0.2"], identities.TOPOLOGY_SAME_ZONE)


def test_external_traffic_policy_local_without_local_endpoints_short_circuits_by_zone() -> None:
    # Pods and the node itself reach a NodePort of an eTP Local Service with no local
    # endpoint through the cluster endpoints, which topology chooses (upstream's
    # UsesClusterEndpoints: "we need Cluster endpoints to implement short circuiting").
    p = plan(
        ep("10.0.0.2", node="node-2", zones=("zone-a",)),
        ep("10.0.0.3", node="node-3", zones=("zone-b",)),
        type="NodePort",
        ports=[{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}],
        externalTrafficPolicy="Local",
    )
    assert chosen(p, NODE_PORT) == (["10.0.0.2"], identities.TOPOLOGY_SAME_ZONE)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ({}, None),
        ("zone-a", None),
        ({"forZones": "zone-a"}, None),
        ({"forZones": [{"name": 3}, "zone-a", None]}, None),
        ({"forZones": [{"name": "a"}, {"nome": "b"}]}, Hints(frozenset({"a"}), frozenset())),
        ({"forNodes": [{"name": "n"}]}, Hints(frozenset(), frozenset({"n"}))),
    ],
)
def test_malformed_hints_are_no_hints(value: Any, expected: Hints | None) -> None:
    assert hints_of(value) == expected


def test_the_rule_survives_the_state_file_and_old_files_read_as_unknown() -> None:
    p = plan(*ZONED)
    doc = p.identity.to_json()
    again = identities.ServiceIdentity.from_json("default/web", doc)
    assert again.virtual_servers[CLUSTER_IP].topology == identities.TOPOLOGY_SAME_ZONE
    doc["virtualServers"] = [row[:7] for row in doc["virtualServers"]]
    old = identities.ServiceIdentity.from_json("default/web", doc)
    assert old.virtual_servers[CLUSTER_IP].topology == ""
