"""EndpointSlices reduced to endpoints: the API's edge cases (pure: no kernel)."""

from __future__ import annotations

from typing import Any

import pytest

from ipvsproxy.core.plan import NodeFacts, PlanConfig, plan_service
from ipvsproxy.core.service_ports import (
    Endpoint,
    InvalidObject,
    ServicePort,
    endpoints_by_port,
    service_ports,
    slice_endpoints,
)
from ipvsproxy.core.virtual_servers import Protocol
from tests.unit.k8s_objects import endpoint, endpoint_slice, service


def endpoints(*slices: dict[str, Any]) -> list[Endpoint]:
    return slice_endpoints(slices, "http", Protocol.TCP)


def test_absent_conditions_mean_ready_and_serving() -> None:
    # EndpointConditions: nil ready and nil serving are each "interpreted as" true, whatever
    # the other says (upstream endpointslicecache.go: serving := Serving == nil || *Serving).
    bare = {"addresses": ["10.244.1.11"], "nodeName": "node-1"}
    empty = {"addresses": ["10.244.1.12"], "nodeName": "node-1", "conditions": {}}
    unready = {"addresses": ["10.244.1.13"], "conditions": {"ready": False}}
    ending = {"addresses": ["10.244.1.14"], "conditions": {"ready": False, "terminating": True}}
    slice_ = endpoint_slice("web", [bare, empty, unready, ending])
    eps = {e.address: e for e in endpoints(slice_)}
    for address in ("10.244.1.11", "10.244.1.12"):
        e = eps[address]
        assert (e.ready, e.serving, e.terminating) == (True, True, False), address
    e = eps["10.244.1.13"]
    assert (e.ready, e.serving, e.terminating) == (False, True, False)
    e = eps["10.244.1.14"]
    assert (e.ready, e.serving, e.terminating) == (False, True, True)


def test_a_terminating_endpoint_without_serving_is_the_fallback() -> None:
    # A slice written by another controller that sets ready and terminating only: with no
    # ready endpoint left, its terminating endpoint (serving absent: serving) takes traffic.
    ending = {"addresses": ["10.244.1.14"], "conditions": {"ready": False, "terminating": True}}
    svc = service("web", "10.96.0.10")
    plan = plan_service(svc, [endpoint_slice("web", [ending])], NodeFacts("node-1"), PlanConfig())
    assert [list(rs) for rs in plan.real_servers.values()] == [[("10.244.1.14", 8080)]]


def test_the_ready_copy_of_a_duplicated_endpoint_wins_in_either_order() -> None:
    ready = endpoint("10.244.1.11")
    unready = endpoint("10.244.1.11", ready=False, serving=False)
    for first, second in ((ready, unready), (unready, ready)):
        a = endpoint_slice("web", [first], name="web-a")
        b = endpoint_slice("web", [second], name="web-b")
        (e,) = endpoints(a, b)
        assert e.address == "10.244.1.11" and e.ready and e.serving
        # Within one slice too.
        (e,) = endpoints(endpoint_slice("web", [first, second]))
        assert e.ready


def test_only_the_first_address_of_an_endpoint_is_used() -> None:
    # The API allows up to 100 addresses per endpoint; consumers use the first (upstream too).
    ep = {**endpoint("10.244.1.11"), "addresses": ["10.244.1.11", "10.244.1.99"]}
    assert [e.address for e in endpoints(endpoint_slice("web", [ep]))] == ["10.244.1.11"]


def ports(svc: dict[str, Any]) -> list[ServicePort]:
    return service_ports(svc)


def test_port_numbers_from_1_to_65535_only() -> None:
    for number in (1, 65535):
        (p,) = ports(service("web", "10.96.0.10", ports=[{"port": number}]))
        assert p.port == number and p.protocol is Protocol.TCP and p.name == ""
    for number in (0, 65536):
        with pytest.raises(InvalidObject, match=f"default/web: port {number} out of range"):
            ports(service("web", "10.96.0.10", ports=[{"port": number}]))
    with pytest.raises(InvalidObject, match="default/web: protocol 'ICMP'"):
        ports(service("web", "10.96.0.10", ports=[{"port": 80, "protocol": "ICMP"}]))


def test_defaults_of_an_unset_field() -> None:
    # No type: ClusterIP (a nodePort left in the port is not served); no affinity; no
    # health-check node port; an unnamed port matches the slice's unnamed port.
    svc = service("web", "10.96.0.10", ports=[{"port": 80, "nodePort": 30080}])
    del svc["spec"]["type"]
    (p,) = ports(svc)
    assert (p.type, p.node_port, p.affinity_timeout, p.health_check_node_port) == (
        "ClusterIP",
        0,
        0,
        0,
    )
    sl = endpoint_slice("web", [endpoint("10.244.1.11")], ports=[{"port": 8080}])
    assert [e.address for e in slice_endpoints([sl], p.name, p.protocol)] == ["10.244.1.11"]


def test_which_services_take_external_traffic_policy_local() -> None:
    def local(stype: str, **spec: Any) -> bool:
        svc = service("web", "10.96.0.10", type=stype, externalTrafficPolicy="Local", **spec)
        return ports(svc)[0].external_local

    assert local("NodePort") and local("LoadBalancer")
    assert local("ClusterIP", externalIPs=["198.51.100.7"])
    assert not local("ClusterIP")


def test_load_balancer_ingress_ip_modes() -> None:
    ingress = [
        {"ip": "203.0.113.1", "ipMode": "VIP"},
        {"ip": "203.0.113.2"},
        {"ip": "203.0.113.3", "ipMode": "Proxy"},
    ]
    lb = service(
        "lb", "10.96.0.10", type="LoadBalancer", status={"loadBalancer": {"ingress": ingress}}
    )
    assert ports(lb)[0].lb_vips == ("203.0.113.1", "203.0.113.2")
    # Whatever the type, as upstream's newBaseServiceInfo.
    np = service("np", "10.96.0.11", type="NodePort", status={"loadBalancer": {"ingress": ingress}})
    assert ports(np)[0].lb_vips == ("203.0.113.1", "203.0.113.2")


def test_only_ipv4_slices_are_read_and_every_one_of_them() -> None:
    v6 = {
        **endpoint_slice("web", [endpoint("fd00::11")], name="web-v6"),
        "addressType": "IPv6",
    }
    fqdn = {**endpoint_slice("web", [endpoint("10.244.1.99")], name="web-f"), "addressType": "FQDN"}
    other_port = endpoint_slice(
        "web", [endpoint("10.244.1.98")], ports=[{"name": "metrics", "port": 9090}], name="web-m"
    )
    v4 = endpoint_slice("web", [endpoint("10.244.1.11")], name="web-v4")
    assert [e.address for e in endpoints(v6, fqdn, other_port, v4)] == ["10.244.1.11"]


def test_an_endpoint_names_its_pod() -> None:
    def pod(ref: dict[str, Any] | None) -> str | None:
        ep = {**endpoint("10.244.1.11"), **({"targetRef": ref} if ref is not None else {})}
        sl = endpoint_slice("web", [ep], namespace="shop")
        (e,) = endpoints(sl)
        return e.pod

    assert pod({"kind": "Pod", "name": "web-1", "namespace": "shop"}) == "shop/web-1"
    assert pod({"name": "web-1"}) == "shop/web-1"  # kind and namespace as the slice's
    assert pod({"kind": "Node", "name": "node-1"}) is None
    assert pod({"kind": "Pod"}) is None
    assert pod(None) is None
    bare = endpoint_slice("web", [{**endpoint("10.244.1.11"), "targetRef": {"name": "p"}}])
    del bare["metadata"]["namespace"]
    (e,) = endpoints(bare)
    assert e.pod == "default/p"


def test_slice_ports_from_1_to_65535_and_each_service_port_on_its_own() -> None:
    def numbers(slice_ports: list[dict[str, Any]]) -> list[list[int]]:
        sl = endpoint_slice("web", [endpoint("10.244.1.11")], ports=slice_ports)
        found = endpoints_by_port([sl], [("a", Protocol.TCP), ("b", Protocol.TCP)])
        return [[e.port for e in eps] for eps in found]

    assert numbers([{"name": "a", "port": 1}, {"name": "b", "port": 65535}]) == [[1], [65535]]
    assert numbers([{"name": "a", "port": 0}, {"name": "b", "port": 65536}]) == [[], []]
    # A Service port missing from the slice, or out of range there, leaves the others alone.
    assert numbers([{"name": "b", "port": 8080}]) == [[], [8080]]
    assert numbers([{"name": "a", "port": 70000}, {"name": "b", "port": 8080}]) == [[], [8080]]


def test_a_dual_stack_service_with_ipv6_first_has_a_cluster_ip_of_each_family() -> None:
    svc = service("web", "fd00::10")
    svc["spec"]["clusterIPs"] = ["fd00::10", "10.96.0.10"]
    assert ports(svc)[0].of_family(4).cluster_ips == ("10.96.0.10",)
    assert ports(svc)[0].of_family(6).cluster_ips == ("fd00::10",)
