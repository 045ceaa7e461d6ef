"""The planner for IPv6 and dual-stack Services: one plan per family, as upstream's per-family
proxiers make (pure: no kernel)."""

from __future__ import annotations

from typing import Any

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.plan import EMPTY, NodeFacts, PlanConfig, ServicePlan, plan_service
from ipvsproxy.core.virtual_servers import Protocol, ServiceKey
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

NODE = NodeFacts(
    name="node-1",
    node_ips=("192.168.56.11", "fc00::11"),
    local_addresses=frozenset({"192.168.56.11", "fc00::11", "fd00:10:244:1::1"}),
    primary_ip="192.168.56.11",
    primary_ip6="fc00::11",
)
BOTH = PlanConfig(families=(4, 6))
V6 = ipset_specs.V6


def dual(name: str = "web", **spec: Any) -> dict[str, Any]:
    svc = service(name, "10.96.0.10", **spec)
    svc["spec"]["clusterIPs"] = ["10.96.0.10", "fd00:10:96::a"]
    svc["spec"]["ipFamilies"] = ["IPv4", "IPv6"]
    return svc


def slice6(name: str, *ips: str, node: str = "node-2") -> dict[str, Any]:
    return {
        **endpoint_slice(name, [endpoint(ip, node=node) for ip in ips], name=f"{name}-v6"),
        "addressType": "IPv6",
    }


def slice4(name: str, *ips: str, node: str = "node-2") -> dict[str, Any]:
    return endpoint_slice(name, [endpoint(ip, node=node) for ip in ips], name=f"{name}-v4")


def plan(svc: dict[str, Any], *slices: dict[str, Any], cfg: PlanConfig = BOTH) -> ServicePlan:
    return plan_service(svc, slices, NODE, cfg)


def dests(p: ServicePlan, key: ServiceKey) -> list[str]:
    return sorted(str(d) for d in p.real_servers[key])


def test_a_dual_stack_cluster_ip_has_a_virtual_server_of_each_family() -> None:
    p = plan(dual(), slice4("web", "10.244.2.5"), slice6("web", "fd00:10:244:2::5"))
    v4 = ServiceKey("10.96.0.10", Protocol.TCP, 80)
    v6 = ServiceKey("fd00:10:96::a", Protocol.TCP, 80)
    assert set(p.virtual_servers) == {v4, v6}
    assert dests(p, v4) == ["10.244.2.5:8080"]
    assert dests(p, v6) == ["[fd00:10:244:2::5]:8080"]
    assert p.bind == {"10.96.0.10", "fd00:10:96::a"}
    assert p.members[ipset_specs.CLUSTER_IP] == {"10.96.0.10,tcp:80"}
    assert p.members[V6[ipset_specs.CLUSTER_IP]] == {"fd00:10:96::a,tcp:80"}
    assert V6[ipset_specs.CLUSTER_IP] == "KUBE-6-CLUSTER-IP"


def test_a_service_of_a_family_the_proxy_does_not_serve_is_skipped() -> None:
    svc = service("v6", "fd00:10:96::b")
    assert plan(svc, slice6("v6", "fd00:10:244:2::5"), cfg=PlanConfig()) is EMPTY
    p = plan(svc, slice6("v6", "fd00:10:244:2::5"))
    assert list(p.virtual_servers) == [ServiceKey("fd00:10:96::b", Protocol.TCP, 80)]
    # Only its IPv4 half when the proxy serves IPv4 only.
    p4 = plan(
        dual(), slice4("web", "10.244.2.5"), slice6("web", "fd00:10:244:2::5"), cfg=PlanConfig()
    )
    assert list(p4.virtual_servers) == [ServiceKey("10.96.0.10", Protocol.TCP, 80)]


def test_node_ports_of_each_family_on_that_familys_node_addresses() -> None:
    svc = dual(
        type="NodePort",
        ports=[
            {"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"},
            {"name": "sctp", "port": 90, "nodePort": 30090, "protocol": "SCTP"},
        ],
    )
    sl4 = slice4("web", "10.244.2.5")
    sl4["ports"] = [
        {"name": "http", "port": 8080, "protocol": "TCP"},
        {"name": "sctp", "port": 9090, "protocol": "SCTP"},
    ]
    sl6 = {**slice6("web", "fd00:10:244:2::5"), "ports": sl4["ports"]}
    p = plan(svc, sl4, sl6)
    node_port6 = ServiceKey("fc00::11", Protocol.TCP, 30080)
    assert dests(p, node_port6) == ["[fd00:10:244:2::5]:8080"]
    assert dests(p, ServiceKey("192.168.56.11", Protocol.TCP, 30080)) == ["10.244.2.5:8080"]
    assert p.members[V6[ipset_specs.NODE_PORT_TCP]] == {"30080"}
    assert p.members[ipset_specs.NODE_PORT_TCP] == {"30080"}
    assert p.members[V6[ipset_specs.NODE_PORT_SCTP]] == {"fc00::11,sctp:30090"}
    assert p.members[ipset_specs.NODE_PORT_SCTP] == {"192.168.56.11,sctp:30090"}
    # Hairpin: the IPv6 endpoint on this node is in the IPv6 loop-back set.
    local = plan(svc, slice6("web", "fd00:10:244:1::5", node="node-1"))
    assert local.members[V6[ipset_specs.LOOP_BACK]] == {
        "fd00:10:244:1::5,tcp:8080,fd00:10:244:1::5"
    }


def test_source_ranges_and_vips_are_split_by_family() -> None:
    svc = dual(
        type="LoadBalancer",
        ports=[{"name": "http", "port": 443, "nodePort": 30443, "protocol": "TCP"}],
        loadBalancerSourceRanges=["192.0.2.0/24", "fc00::/64"],
        externalIPs=["198.51.100.9", "2001:db8::9"],
        status={"loadBalancer": {"ingress": [{"ip": "203.0.113.30"}, {"ip": "2001:db8::30"}]}},
    )
    p = plan(svc)
    assert p.members[ipset_specs.LOAD_BALANCER_SOURCE_CIDR] == {"203.0.113.30,tcp:443,192.0.2.0/24"}
    assert p.members[V6[ipset_specs.LOAD_BALANCER_SOURCE_CIDR]] == {
        "2001:db8::30,tcp:443,fc00::/64"
    }
    # The node's IPv6 address is in its family's range: it may reach the IPv6 VIP; its IPv4
    # address is not in the IPv4 ones: the IPv4 VIP is filtered for it.
    assert p.members[V6[ipset_specs.LOAD_BALANCER_SOURCE_IP]] == {
        "2001:db8::30,tcp:443,2001:db8::30"
    }
    assert [f.address for f in p.out_filters] == ["203.0.113.30"]
    assert p.members[V6[ipset_specs.EXTERNAL_IP]] == {"2001:db8::9,tcp:443"}
    assert p.members[ipset_specs.EXTERNAL_IP] == {"198.51.100.9,tcp:443"}
    assert {"2001:db8::9", "2001:db8::30", "fd00:10:96::a"} <= p.bind
    # A family's /0 opens that family only.
    opened = plan(
        {**svc, "spec": {**svc["spec"], "loadBalancerSourceRanges": ["::/0", "192.0.2.0/24"]}}
    )
    assert V6[ipset_specs.LOAD_BALANCER_SOURCE_CIDR] not in opened.members
    assert opened.members[ipset_specs.LOAD_BALANCER_SOURCE_CIDR] == {
        "203.0.113.30,tcp:443,192.0.2.0/24"
    }


def test_affinity_persists_per_ipv6_client_address() -> None:
    p = plan(dual(sessionAffinity="ClientIP"), slice6("web", "fd00:10:244:2::5"))
    vs = p.virtual_servers[ServiceKey("fd00:10:96::a", Protocol.TCP, 80)]
    assert vs.timeout == 10800 and vs.prefix_len == 128


def test_ipv6_endpoints_the_kernel_refuses_are_skipped_with_a_warning() -> None:
    odd = {"fe80::1": "link-local", "ff02::1": "multicast", "::": "unspecified", "10.1.1.1": "IPv4"}
    p = plan(dual(), slice6("web", "fd00:10:244:2::5", *odd))
    assert dests(p, ServiceKey("fd00:10:96::a", Protocol.TCP, 80)) == ["[fd00:10:244:2::5]:8080"]
    (warning,) = p.warnings
    for address, why in odd.items():
        assert f"'{address}' (" in warning and why in warning.split(f"'{address}' (")[1]


def test_bound_addresses_are_members_of_their_familys_ipvs_ips_set() -> None:
    from ipvsproxy.core.desired import DesiredState

    desired = DesiredState()
    changes = desired.update("default/web", plan(dual(), slice4("web", "10.244.2.5")))
    assert changes.addresses == {"10.96.0.10", "fd00:10:96::a"}
    assert changes.members[ipset_specs.IPVS_IPS] == {"10.96.0.10"}
    assert changes.members[V6[ipset_specs.IPVS_IPS]] == {"fd00:10:96::a"}
    assert set(desired.member_keys(ipset_specs.IPVS_IPS)) == {"10.96.0.10"}
    assert set(desired.member_keys(V6[ipset_specs.IPVS_IPS])) == {"fd00:10:96::a"}
    assert set(desired.binds()) == {"10.96.0.10", "fd00:10:96::a"}
    assert {ipset_specs.IPVS_IPS, V6[ipset_specs.IPVS_IPS]} <= desired.nonempty_sets()
    gone = desired.update("default/web", plan(service("web", "10.96.0.10")))
    assert gone.members[V6[ipset_specs.IPVS_IPS]] == {"fd00:10:96::a"}
    assert not desired.member_keys(V6[ipset_specs.IPVS_IPS])
    assert desired.is_bound("10.96.0.10") and not desired.is_bound("fd00:10:96::a")


def test_no_local_endpoints_is_per_family() -> None:
    """Upstream's IPv4 and IPv6 proxiers each count a Service whose endpoints of their family
    are all elsewhere."""
    svc = dual("web", type="NodePort", externalTrafficPolicy="Local")
    svc["spec"]["ports"][0]["nodePort"] = 30080
    here6 = slice6("web", "fd00:10:244:1::5", node="node-1")
    p = plan(svc, slice4("web", "10.244.2.5"), here6)
    assert p.no_local_endpoints == {("external", 4)}
    p = plan(svc, slice4("web", "10.244.2.5"), slice6("web", "fd00:10:244:2::5"))
    assert p.no_local_endpoints == {("external", 4), ("external", 6)}
