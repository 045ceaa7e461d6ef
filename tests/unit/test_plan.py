"""The planner, rule by rule (pure: no kernel)."""

from __future__ import annotations

from typing import Any

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.plan import EMPTY, NodeFacts, OutFilter, PlanConfig, ServicePlan, plan_service
from ipvsproxy.core.virtual_servers import SVC_F_PERSISTENT, DestKey, Protocol, ServiceKey
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

NODE = NodeFacts(
    name="node-1",
    node_ips=("192.168.56.11",),
    local_addresses=frozenset({"192.168.56.11", "10.244.1.1"}),
    primary_ip="192.168.56.11",
)
CFG = PlanConfig()


def plan(svc: dict[str, Any] | None, *slices: dict[str, Any], **cfg: Any) -> ServicePlan:
    return plan_service(svc, slices, NODE, PlanConfig(**cfg) if cfg else CFG)


def dests(p: ServicePlan, address: str, port: int, proto: Protocol = Protocol.TCP) -> list[str]:
    return sorted(str(k) for k in p.real_servers[ServiceKey(address, proto, port)])


def test_cluster_ip_service() -> None:
    p = plan(
        service("web", "10.96.0.10"),
        endpoint_slice("web", [endpoint("10.244.1.11"), endpoint("10.244.2.11", node="node-2")]),
    )
    key = ServiceKey("10.96.0.10", Protocol.TCP, 80)
    assert list(p.virtual_servers) == [key]
    assert p.virtual_servers[key].scheduler == "rr"
    assert dests(p, "10.96.0.10", 80) == ["10.244.1.11:8080", "10.244.2.11:8080"]
    assert all(rs.weight == 1 and rs.fwd_method == 0 for rs in p.real_servers[key].values())
    assert p.bind == {"10.96.0.10"}
    assert p.members[ipset_specs.CLUSTER_IP] == {"10.96.0.10,tcp:80"}
    # Only the endpoint on this node is a hairpin candidate.
    assert p.members[ipset_specs.LOOP_BACK] == {"10.244.1.11,tcp:8080,10.244.1.11"}


def test_ports_are_matched_by_name_and_protocol() -> None:
    svc = service(
        "dns",
        "10.96.0.53",
        ports=[
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            {"name": "metrics", "port": 9153, "protocol": "TCP"},
        ],
    )
    sl = endpoint_slice(
        "dns",
        [endpoint("10.244.1.5")],
        ports=[
            {"name": "dns", "port": 5353, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 5353, "protocol": "TCP"},
        ],
    )
    p = plan(svc, sl)
    assert dests(p, "10.96.0.53", 53, Protocol.UDP) == ["10.244.1.5:5353"]
    assert dests(p, "10.96.0.53", 53, Protocol.TCP) == ["10.244.1.5:5353"]
    assert dests(p, "10.96.0.53", 9153) == []  # no slice port named metrics


def test_slices_are_merged_and_deduplicated() -> None:
    a = endpoint_slice("web", [endpoint("10.244.1.11"), endpoint("10.244.1.12")], name="web-a")
    b = endpoint_slice("web", [endpoint("10.244.1.12"), endpoint("10.244.3.7", "node-3")], name="b")
    p = plan(service("web", "10.96.0.10"), a, b)
    assert dests(p, "10.96.0.10", 80) == ["10.244.1.11:8080", "10.244.1.12:8080", "10.244.3.7:8080"]


def test_terminating_fallback_and_unready_endpoints() -> None:
    svc = service("web", "10.96.0.10")
    ready = endpoint("10.244.1.11")
    draining = endpoint("10.244.1.12", ready=False, serving=True, terminating=True)
    dead = endpoint("10.244.1.13", ready=False, serving=False, terminating=True)
    unready = endpoint("10.244.1.14", ready=False, serving=False)
    assert dests(
        plan(svc, endpoint_slice("web", [ready, draining, dead, unready])), "10.96.0.10", 80
    ) == ["10.244.1.11:8080"]
    # No ready endpoint: serving-and-terminating ones take the traffic.
    assert dests(plan(svc, endpoint_slice("web", [draining, dead, unready])), "10.96.0.10", 80) == [
        "10.244.1.12:8080"
    ]
    assert dests(plan(svc, endpoint_slice("web", [dead, unready])), "10.96.0.10", 80) == []


def test_skipped_services() -> None:
    assert plan(service("h", "None")) is EMPTY
    assert plan({"metadata": {"name": "x"}, "spec": {"type": "ExternalName"}}) is EMPTY
    assert plan(service("h", "10.96.0.9", labels={"service.kubernetes.io/headless": ""})) is EMPTY
    other = service("o", "10.96.0.8", labels={"service.kubernetes.io/service-proxy-name": "foo"})
    assert plan(other) is EMPTY
    assert plan(other, proxy_name="foo") is not EMPTY
    assert plan(service("u", "10.96.0.7"), proxy_name="foo") is EMPTY
    assert plan(None) is EMPTY


def test_invalid_service_is_an_error_naming_the_field() -> None:
    p = plan(service("bad", "10.96.0.10", ports=[{"port": 80, "protocol": "ICMP"}]))
    assert p.error is not None
    assert "default/bad" in p.error and "protocol" in p.error
    assert not p.virtual_servers
    # An unparsable externalIP is that entry's problem only (test_plan_inputs.py).
    p = plan(service("bad", "10.96.0.10", externalIPs=["not-an-ip"]))
    assert p.error is None and "externalIP 'not-an-ip'" in p.warnings[0]


def test_node_port() -> None:
    svc = service(
        "np",
        "10.96.0.20",
        type="NodePort",
        ports=[{"name": "http", "port": 80, "nodePort": 30080, "protocol": "TCP"}],
    )
    p = plan(svc, endpoint_slice("np", [endpoint("10.244.2.11", "node-2")]))
    assert set(p.virtual_servers) == {
        ServiceKey("10.96.0.20", Protocol.TCP, 80),
        ServiceKey("192.168.56.11", Protocol.TCP, 30080),
    }
    assert p.bind == {"10.96.0.20"}  # node addresses are never bound to kube-ipvs0
    assert p.members[ipset_specs.NODE_PORT_TCP] == {"30080"}
    assert ipset_specs.NODE_PORT_LOCAL_TCP not in p.members
    assert dests(p, "192.168.56.11", 30080) == ["10.244.2.11:8080"]


def test_sctp_node_port_uses_the_hash_set() -> None:
    svc = service(
        "s",
        "10.96.0.21",
        type="NodePort",
        ports=[{"name": "http", "port": 80, "nodePort": 30081, "protocol": "SCTP"}],
    )
    p = plan(svc)
    assert p.members[ipset_specs.NODE_PORT_SCTP] == {"192.168.56.11,sctp:30081"}
    assert p.members[ipset_specs.CLUSTER_IP] == {"10.96.0.21,sctp:80"}


def test_external_traffic_policy_local() -> None:
    svc = service(
        "lb",
        "10.96.0.30",
        type="LoadBalancer",
        ports=[{"name": "http", "port": 80, "nodePort": 30090, "protocol": "TCP"}],
        externalTrafficPolicy="Local",
        healthCheckNodePort=32000,
        status={"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}},
    )
    local, remote = endpoint("10.244.1.11"), endpoint("10.244.2.11", "node-2")
    p = plan(svc, endpoint_slice("lb", [local, remote]))
    # ClusterIP: every endpoint. NodePort and LB: this node's only.
    assert dests(p, "10.96.0.30", 80) == ["10.244.1.11:8080", "10.244.2.11:8080"]
    assert dests(p, "192.168.56.11", 30090) == ["10.244.1.11:8080"]
    assert dests(p, "203.0.113.10", 80) == ["10.244.1.11:8080"]
    assert p.members[ipset_specs.NODE_PORT_LOCAL_TCP] == {"30090"}
    assert p.members[ipset_specs.LOAD_BALANCER_LOCAL] == {"203.0.113.10,tcp:80"}
    assert p.members[ipset_specs.HEALTH_CHECK_NODE_PORT] == {"32000"}
    assert p.no_local_endpoints == frozenset()
    assert ipset_specs.NO_LOCAL_ENDPOINTS not in p.members
    # No local endpoint: external clients are not forwarded (nftables-mode semantics: the
    # filter drops their new connections to KUBE-NO-LOCAL-ENDPOINTS), while pods and the node
    # reach the cluster's endpoints through the same virtual servers (issue 13 B9).
    p = plan(svc, endpoint_slice("lb", [remote]))
    assert dests(p, "192.168.56.11", 30090) == ["10.244.2.11:8080"]
    assert dests(p, "203.0.113.10", 80) == ["10.244.2.11:8080"]
    assert p.members[ipset_specs.NO_LOCAL_ENDPOINTS] == {
        "192.168.56.11,tcp:30090",
        "203.0.113.10,tcp:80",
    }
    assert dests(p, "10.96.0.30", 80) == ["10.244.2.11:8080"]
    assert p.no_local_endpoints == {("external", 4)}
    # No endpoint anywhere: nothing to short-circuit to.
    p = plan(svc, endpoint_slice("lb", []))
    assert dests(p, "203.0.113.10", 80) == [] and ipset_specs.NO_LOCAL_ENDPOINTS not in p.members


def test_internal_traffic_policy_local() -> None:
    svc = service("itp", "10.96.0.31", internalTrafficPolicy="Local")
    p = plan(
        svc, endpoint_slice("itp", [endpoint("10.244.1.11"), endpoint("10.244.2.11", "node-2")])
    )
    assert dests(p, "10.96.0.31", 80) == ["10.244.1.11:8080"]
    p = plan(svc, endpoint_slice("itp", [endpoint("10.244.2.11", "node-2")]))
    assert dests(p, "10.96.0.31", 80) == []


def test_external_ips_and_lb_ingress() -> None:
    svc = service(
        "lb",
        "10.96.0.40",
        type="LoadBalancer",
        ports=[{"name": "http", "port": 80, "nodePort": 30100, "protocol": "TCP"}],
        externalIPs=["198.51.100.7", "192.168.56.11"],
        status={
            "loadBalancer": {
                "ingress": [
                    {"ip": "203.0.113.20"},
                    {"ip": "203.0.113.21", "ipMode": "Proxy"},
                    {"hostname": "lb.example.com"},
                ]
            }
        },
    )
    p = plan(svc)
    keys = {(k.address, k.port) for k in p.virtual_servers}
    assert ("198.51.100.7", 80) in keys
    assert ("203.0.113.20", 80) in keys
    assert ("203.0.113.21", 80) not in keys  # ipMode Proxy: the load balancer proxies
    # A node's own address is refused (it would take the node's own port 80), and reported.
    assert ("192.168.56.11", 80) not in keys
    assert "externalIP '192.168.56.11' (this node's address)" in p.warnings[0]
    assert p.bind == {"10.96.0.40", "198.51.100.7", "203.0.113.20"}
    assert p.members[ipset_specs.EXTERNAL_IP] == {"198.51.100.7,tcp:80"}
    assert p.members[ipset_specs.LOAD_BALANCER] == {"203.0.113.20,tcp:80"}


def test_load_balancer_source_ranges() -> None:
    def lb(ranges: list[str]) -> dict[str, Any]:
        return service(
            "fw",
            "10.96.0.50",
            type="LoadBalancer",
            ports=[{"name": "http", "port": 443, "nodePort": 30443, "protocol": "TCP"}],
            loadBalancerSourceRanges=ranges,
            status={"loadBalancer": {"ingress": [{"ip": "203.0.113.30"}]}},
        )

    p = plan(lb(["192.0.2.0/24", " 198.51.100.0/25 "]))
    assert p.members[ipset_specs.LOAD_BALANCER_FW] == {"203.0.113.30,tcp:443"}
    assert p.members[ipset_specs.LOAD_BALANCER_SOURCE_CIDR] == {
        "203.0.113.30,tcp:443,192.0.2.0/24",
        "203.0.113.30,tcp:443,198.51.100.0/25",
    }
    # The node itself is outside the ranges: it may not reach the VIP.
    assert ipset_specs.LOAD_BALANCER_SOURCE_IP not in p.members
    assert p.out_filters == {OutFilter("203.0.113.30", Protocol.TCP, 443)}
    p = plan(lb(["192.168.56.0/24"]))
    assert p.members[ipset_specs.LOAD_BALANCER_SOURCE_IP] == {"203.0.113.30,tcp:443,203.0.113.30"}
    assert not p.out_filters
    # None parses: closed to everyone, never open (test_plan_inputs.py).
    bad = plan(lb(["nonsense"]))
    assert bad.error is None and "loadBalancerSourceRanges" in bad.warnings[0]
    assert bad.out_filters == {OutFilter("203.0.113.30", Protocol.TCP, 443)}
    assert ipset_specs.LOAD_BALANCER_SOURCE_CIDR not in bad.members


def test_session_affinity() -> None:
    svc = service("sticky", "10.96.0.60", sessionAffinity="ClientIP")
    vs = plan(svc).virtual_servers[ServiceKey("10.96.0.60", Protocol.TCP, 80)]
    assert vs.flags & SVC_F_PERSISTENT and vs.timeout == 10800
    svc["spec"]["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": 60}}
    vs = plan(svc).virtual_servers[ServiceKey("10.96.0.60", Protocol.TCP, 80)]
    assert vs.timeout == 60


def test_scheduler_from_config() -> None:
    p = plan(service("w", "10.96.0.70"), scheduler="lc")
    assert {vs.scheduler for vs in p.virtual_servers.values()} == {"lc"}


def test_the_plan_does_not_depend_on_the_order_of_slices_and_endpoints() -> None:
    svc = service("web", "10.96.0.10")
    eps = [endpoint(f"10.244.{1 + i % 2}.{i}", node=f"node-{1 + i % 2}") for i in range(1, 20)]
    # Two endpoints are in both slices, unready in the second (as while a Pod moves between
    # slices): whichever slice comes first, the ready copy counts.
    unready = [{**e, "conditions": {"ready": False, "serving": False}} for e in eps[8:10]]
    a = endpoint_slice("web", eps[:10], name="web-a")
    b = endpoint_slice("web", unready + eps[10:], name="web-b")
    reference = plan(svc, a, b)
    a_shuffled = endpoint_slice("web", eps[:10][::-1], name="web-a")
    b_shuffled = endpoint_slice("web", eps[10:][::-1] + unready, name="web-b")
    assert plan(svc, b_shuffled, a_shuffled) == reference
    key = ServiceKey("10.96.0.10", Protocol.TCP, 80)
    assert len(reference.real_servers[key]) == 19
    assert DestKey("10.244.2.3", 8080) in reference.real_servers[key]


def test_a_service_without_an_ipv4_cluster_ip_is_skipped() -> None:
    svc = service(
        "v6",
        "fd00::10",
        type="NodePort",
        ports=[{"name": "http", "port": 80, "nodePort": 30123, "protocol": "TCP"}],
        externalIPs=["198.51.100.9"],
    )
    assert plan(svc) is EMPTY


def lb_with_ranges(ranges: list[str], ingress: str = "203.0.113.30") -> dict[str, Any]:
    return service(
        "fw",
        "10.96.0.50",
        type="LoadBalancer",
        ports=[{"name": "http", "port": 443, "nodePort": 30443, "protocol": "TCP"}],
        loadBalancerSourceRanges=ranges,
        status={"loadBalancer": {"ingress": [{"ip": ingress}]}},
    )


def test_the_node_may_reach_a_vip_when_any_one_of_its_ranges_holds_it() -> None:
    p = plan(lb_with_ranges(["192.0.2.0/24", "192.168.56.0/24"]))
    # One range of two holds the node's IP: the node is a permitted source.
    assert p.members[ipset_specs.LOAD_BALANCER_SOURCE_IP] == {"203.0.113.30,tcp:443,203.0.113.30"}
    assert not p.out_filters
    p = plan(lb_with_ranges(["192.0.2.0/24", "198.51.100.0/24"]))
    assert ipset_specs.LOAD_BALANCER_SOURCE_IP not in p.members
    assert p.out_filters == {OutFilter("203.0.113.30", Protocol.TCP, 443)}


def test_a_load_balancer_ip_that_is_a_node_address_is_refused() -> None:
    # Its virtual server would take the node's own port; bound on kube-ipvs0 (on the nodes
    # that do not own it) KUBE-IPVS-FILTER would refuse new connections to its other ports.
    p = plan(lb_with_ranges([], ingress="192.168.56.11"))
    assert ServiceKey("192.168.56.11", Protocol.TCP, 443) not in p.virtual_servers
    assert ipset_specs.LOAD_BALANCER not in p.members
    assert p.bind == {"10.96.0.50"}
    assert "load-balancer ingress IP '192.168.56.11' (this node's address)" in p.warnings[0]


SVC_F_SCHED_MH_PORT = 0x0010  # IP_VS_SVC_F_SCHED_MH_PORT: what upstream sets for mh


def test_the_mh_scheduler_hashes_the_source_port_too() -> None:
    key = ServiceKey("10.96.0.70", Protocol.TCP, 80)
    vs = plan(service("w", "10.96.0.70"), scheduler="mh").virtual_servers[key]
    assert vs.scheduler == "mh" and vs.flags == SVC_F_SCHED_MH_PORT
    sticky = service("w", "10.96.0.70", sessionAffinity="ClientIP")
    vs = plan(sticky, scheduler="mh").virtual_servers[key]
    assert vs.flags == SVC_F_SCHED_MH_PORT | SVC_F_PERSISTENT
    # Other schedulers take no scheduler flag.
    assert plan(service("w", "10.96.0.70"), scheduler="rr").virtual_servers[key].flags == 0
    assert plan(sticky, scheduler="sh").virtual_servers[key].flags == SVC_F_PERSISTENT


def test_no_local_endpoints_names_each_policy_of_a_service_with_endpoints_none_here() -> None:
    """As upstream's IPVS proxier (serviceNoLocalEndpointsInternal/External): a Service counts
    once per policy and family, whatever its number of ports, when it has endpoints but none
    on this node."""
    two_ports = [
        {"name": "http", "port": 80, "nodePort": 30091, "protocol": "TCP"},
        {"name": "dns", "port": 53, "nodePort": 30092, "protocol": "UDP"},
    ]
    svc = service(
        "lb", "10.96.0.30", type="NodePort", ports=two_ports, externalTrafficPolicy="Local"
    )
    slice_ports = [
        {"name": "http", "port": 8080, "protocol": "TCP"},
        {"name": "dns", "port": 5353, "protocol": "UDP"},
    ]
    remote = endpoint_slice("lb", [endpoint("10.244.2.11", "node-2")], ports=slice_ports)
    assert plan(svc, remote).no_local_endpoints == {("external", 4)}
    local = endpoint_slice("lb", [endpoint("10.244.1.11")], ports=slice_ports)
    assert plan(svc, local).no_local_endpoints == frozenset()
    # No endpoint anywhere: nothing is missing on this node in particular.
    assert plan(svc).no_local_endpoints == frozenset()
    # internalTrafficPolicy Local alone is "internal".
    itp = service("itp", "10.96.0.31", internalTrafficPolicy="Local")
    elsewhere = endpoint_slice("itp", [endpoint("10.244.2.11", "node-2")])
    assert plan(itp, elsewhere).no_local_endpoints == {("internal", 4)}
    # Both policies Local: both.
    both = service(
        "both",
        "10.96.0.33",
        type="NodePort",
        ports=two_ports,
        externalTrafficPolicy="Local",
        internalTrafficPolicy="Local",
    )
    assert plan(both, replace_service_name(remote, "both")).no_local_endpoints == {
        ("internal", 4),
        ("external", 4),
    }
    # Cluster policies never count.
    c = service("c", "10.96.0.32")
    assert plan(c, endpoint_slice("c", [endpoint("10.244.2.11", "node-2")])).no_local_endpoints == (
        frozenset()
    )


def test_external_no_local_endpoints_needs_a_virtual_server_that_uses_local_endpoints() -> None:
    """Upstream counts "external" while syncing a virtual server that takes the local
    endpoints only: an external one, or the cluster IP's with internalTrafficPolicy Local. A
    load balancer without a node port and without an ingress address yet has neither."""
    lb = service(
        "lb",
        "10.96.0.34",
        type="LoadBalancer",
        externalTrafficPolicy="Local",
        allocateLoadBalancerNodePorts=False,
    )
    remote = endpoint_slice("lb", [endpoint("10.244.2.11", "node-2")])
    assert plan(lb, remote).no_local_endpoints == frozenset()
    lb["status"] = {"loadBalancer": {"ingress": [{"ip": "203.0.113.10"}]}}
    assert plan(lb, remote).no_local_endpoints == {("external", 4)}


def replace_service_name(sl: dict[str, Any], name: str) -> dict[str, Any]:
    meta = {**sl["metadata"], "labels": {"kubernetes.io/service-name": name}}
    return {**sl, "metadata": meta}


def test_external_ips_with_external_traffic_policy_local() -> None:
    svc = service("e", "10.96.0.80", externalIPs=["198.51.100.8"], externalTrafficPolicy="Local")
    p = plan(svc, endpoint_slice("e", [endpoint("10.244.1.11"), endpoint("10.244.2.11", "node-2")]))
    assert p.members[ipset_specs.EXTERNAL_IP_LOCAL] == {"198.51.100.8,tcp:80"}
    assert ipset_specs.EXTERNAL_IP not in p.members
    assert dests(p, "198.51.100.8", 80) == ["10.244.1.11:8080"]


def test_a_health_check_node_port_only_for_a_load_balancer_with_local_policy() -> None:
    def hc(stype: str, policy: str) -> frozenset[str] | None:
        svc = service(
            "h",
            "10.96.0.81",
            type=stype,
            ports=[{"name": "http", "port": 80, "nodePort": 30081, "protocol": "TCP"}],
            externalTrafficPolicy=policy,
            healthCheckNodePort=32001,
        )
        return plan(svc).members.get(ipset_specs.HEALTH_CHECK_NODE_PORT)

    assert hc("LoadBalancer", "Local") == frozenset({"32001"})
    assert hc("LoadBalancer", "Cluster") is None
    assert hc("NodePort", "Local") is None


def test_the_plan_names_each_virtual_server_and_endpoint() -> None:
    svc = service(
        "web",
        "10.96.0.82",
        type="LoadBalancer",
        ports=[{"name": "http", "port": 80, "nodePort": 30082, "protocol": "TCP"}],
        externalIPs=["198.51.100.9"],
        status={"loadBalancer": {"ingress": [{"ip": "203.0.113.82"}]}},
    )
    a = {**endpoint("10.244.1.11"), "targetRef": {"kind": "Pod", "name": "web-a"}}
    b = {**endpoint("10.244.2.11", "node-2"), "targetRef": {"kind": "Pod", "name": "web-b"}}
    ident = plan(svc, endpoint_slice("web", [a, b])).identity
    roles = {k.address: (i.service, i.port_name, i.role) for k, i in ident.virtual_servers.items()}
    assert roles == {
        "10.96.0.82": ("default/web", "http", "ClusterIP"),
        "198.51.100.9": ("default/web", "http", "ExternalIP"),
        "203.0.113.82": ("default/web", "http", "LoadBalancer"),
        "192.168.56.11": ("default/web", "http", "NodePort"),
    }
    assert {a: (e.pod, e.node) for a, e in ident.endpoints.items()} == {
        "10.244.1.11": ("default/web-a", "node-1"),
        "10.244.2.11": ("default/web-b", "node-2"),
    }


def test_no_affinity_means_no_persistence_timeout() -> None:
    vs = plan(service("w", "10.96.0.71")).virtual_servers[
        ServiceKey("10.96.0.71", Protocol.TCP, 80)
    ]
    assert (vs.flags, vs.timeout) == (0, 0)


def test_source_ranges_on_a_node_without_a_primary_ip() -> None:
    node = NodeFacts(name="node-1", node_ips=("192.168.56.11",))
    p = plan_service(lb_with_ranges(["192.168.56.0/24"]), [], node, CFG)
    assert p.error is None
    assert ipset_specs.LOAD_BALANCER_SOURCE_IP not in p.members
    assert p.out_filters == {OutFilter("203.0.113.30", Protocol.TCP, 443)}
