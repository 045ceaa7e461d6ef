"""The synthetic cluster of the benchmarks, and the host benchmark at a tiny size (no timing
asserts: only that it runs and reports what it should)."""

from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import replace
from typing import Any

import pytest

from bench import host
from ipvsproxy.core.plan import PlanConfig, plan_service
from ipvsproxy.core.service_ports import service_ports, slice_endpoints
from lab.cluster import synthetic

CLUSTER_NET = ipaddress.ip_network("10.96.0.0/12")
POD_NET = ipaddress.ip_network("10.244.0.0/16")
POD_NET6 = ipaddress.ip_network("fd00:10:244::/48")


def node_ports(entries: list[synthetic.ServiceEntry]) -> list[int]:
    return [p["nodePort"] for _, svc, _ in entries for p in svc["spec"]["ports"] if "nodePort" in p]


def endpoints_of(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [ep for sl in slices for ep in sl["endpoints"]]


def test_the_mix_of_service_types_and_ports() -> None:
    entries = synthetic.cluster(200, 3)
    types = Counter(svc["spec"]["type"] for _, svc, _ in entries)
    assert types == {"ClusterIP": 160, "NodePort": 30, "LoadBalancer": 10}
    counts = Counter(len(svc["spec"]["ports"]) for _, svc, _ in entries)
    assert set(counts) == {1, 2, 3}
    protocols = Counter(p["protocol"] for _, svc, _ in entries for p in svc["spec"]["ports"])
    assert set(protocols) == {"TCP", "UDP"} and protocols["TCP"] > 5 * protocols["UDP"]
    for key, svc, slices in entries:
        assert key == f"{svc['metadata']['namespace']}/{svc['metadata']['name']}"
        names = [p["name"] for p in svc["spec"]["ports"]]
        assert len(set(names)) == len(names)
        # Every Service port has its port in the slice, under the same name and protocol.
        by_name = {(p["name"], p["protocol"]) for p in slices[0]["ports"]}
        assert by_name == {(p["name"], p["protocol"]) for p in svc["spec"]["ports"]}
        ingress = svc["status"]["loadBalancer"].get("ingress", [])
        if svc["spec"]["type"] == "LoadBalancer":
            assert len(ingress) == 1 and ipaddress.ip_address(ingress[0]["ip"])
        else:
            assert ingress == []
        # The first port of a NodePort or LoadBalancer Service, and only that one, has a node
        # port; ClusterIP Services have none.
        with_node_port = [p for p in svc["spec"]["ports"] if "nodePort" in p]
        if svc["spec"]["type"] == "ClusterIP":
            assert with_node_port == []
        else:
            assert with_node_port == [svc["spec"]["ports"][0]]


def test_cluster_ips_and_node_ports_are_unique_and_in_range() -> None:
    entries = synthetic.cluster(2000, 1)
    ips = [svc["spec"]["clusterIP"] for _, svc, _ in entries]
    assert len(set(ips)) == len(ips)
    assert all(ipaddress.ip_address(ip) in CLUSTER_NET for ip in ips)
    assert all(svc["spec"]["clusterIPs"] == [svc["spec"]["clusterIP"]] for _, svc, _ in entries)
    ports = node_ports(entries)
    assert len(set(ports)) == len(ports) == 400
    assert all(30000 <= p <= 32767 for p in ports)


def test_node_ports_last_to_ten_thousand_services_and_never_wrap() -> None:
    # The rule in the module docstring: one node port per NodePort or LoadBalancer Service.
    assert synthetic.node_port_ordinal(9999) == 1999
    last = max(i for i in range(20000) if synthetic.node_port_ordinal(i) == 2767)
    assert last == 13839
    synthetic.service_at(last, 0)  # the last Service the range can serve
    with pytest.raises(ValueError, match="exhausted"):
        synthetic.service_at(last + 20, 0)


def test_endpoints_count_nodes_and_references() -> None:
    entries = synthetic.cluster(40, 7)
    for _, svc, slices in entries:
        assert len(slices) == 1
        sl = slices[0]
        assert sl["addressType"] == "IPv4"
        assert sl["metadata"]["labels"]["kubernetes.io/service-name"] == svc["metadata"]["name"]
        eps = endpoints_of(slices)
        assert len(eps) == 7
        addresses = [ep["addresses"][0] for ep in eps]
        assert len(set(addresses)) == 7
        assert all(ipaddress.ip_address(a) in POD_NET for a in addresses)
        assert all(ep["conditions"]["ready"] for ep in eps)
        assert all(ep["targetRef"]["kind"] == "Pod" and ep["targetRef"]["name"] for ep in eps)
    nodes = Counter(ep["nodeName"] for _, _, slices in entries for ep in endpoints_of(slices))
    assert set(nodes) == {f"node-{i}" for i in range(1, 11)}
    assert max(nodes.values()) - min(nodes.values()) <= 1


def test_the_objects_are_what_the_planner_reads() -> None:
    for _, svc, slices in synthetic.cluster(60, 4):
        ports = service_ports(svc)
        assert [sp.port for sp in ports] == [p["port"] for p in svc["spec"]["ports"]]
        for sp in ports:
            assert len(slice_endpoints(slices, sp.name, sp.protocol)) == 4
        plan = plan_service(svc, slices, host.NODE, PlanConfig())
        assert plan.error is None and plan.virtual_servers
        assert all(len(rs) == 4 for rs in plan.real_servers.values())


def test_dual_stack_services_double_what_the_planner_programs() -> None:
    """``dual_stack``: every virtual server has its IPv6 twin (cluster IP, NodePort on the
    node's IPv6 address, load-balancer VIP) with the same pods at their IPv6 addresses, and
    endpoint changes made to the IPv4 slices carry over."""
    node = replace(host.NODE, node_ips=(host.NODE_IP, "fc00::b"), primary_ip6="fc00::b")
    both = PlanConfig(families=(4, 6))
    for entry in synthetic.cluster(60, 4):
        key, svc, slices = synthetic.dual_stack(entry)
        assert [sl["addressType"] for sl in slices] == ["IPv4", "IPv6"]
        v4 = plan_service(entry[1], entry[2], node, both)
        plan = plan_service(svc, slices, node, both)
        assert plan.error is None and len(plan.virtual_servers) == 2 * len(v4.virtual_servers)
        six = [vs for vs in plan.real_servers if ":" in vs.address]
        assert len(six) == len(v4.virtual_servers)
        for vs in six:
            reals = plan.real_servers[vs]
            assert len(reals) == 4
            assert all(ipaddress.ip_address(r.address) in POD_NET6 for r in reals)
    key, svc, slices = synthetic.cluster(30, 5)[7]
    added = synthetic.dual_stack((key, svc, synthetic.with_endpoint_added(slices)))[2]
    assert [len(sl["endpoints"]) for sl in added] == [6, 6]
    assert added[1]["endpoints"][-1]["addresses"] == [
        synthetic.pod_ip6(added[0]["endpoints"][-1]["addresses"][0])
    ]


def test_the_cluster_is_the_same_for_the_same_seed() -> None:
    assert synthetic.cluster(120, 5) == synthetic.cluster(120, 5)
    assert synthetic.cluster(120, 5, seed=3) == synthetic.cluster(120, 5, seed=3)
    assert synthetic.cluster(120, 5, seed=3) != synthetic.cluster(120, 5)
    # Service i does not depend on how many others there are.
    assert synthetic.cluster(120, 5)[:50] == synthetic.cluster(50, 5)


def test_changed_endpoints_and_a_new_service() -> None:
    entries = synthetic.cluster(30, 5)
    _, _, base = entries[7]
    before = [dict(ep) for ep in endpoints_of(base)]

    added = endpoints_of(synthetic.with_endpoint_added(base))
    assert len(added) == 6
    assert added[-1]["addresses"][0] not in {ep["addresses"][0] for ep in before}
    removed = endpoints_of(synthetic.with_endpoint_removed(base))
    assert removed == before[:-1]
    flipped = endpoints_of(synthetic.with_endpoint_not_ready(base))
    assert flipped[0]["conditions"]["ready"] is False
    assert flipped[1:] == before[1:]
    assert [dict(ep) for ep in endpoints_of(base)] == before  # the input is left alone

    key, svc, slices = synthetic.new_service(entries)
    assert key not in {k for k, _, _ in entries}
    assert svc["spec"]["clusterIP"] not in {s["spec"]["clusterIP"] for _, s, _ in entries}
    assert len(endpoints_of(slices)) == 5


def test_the_host_benchmark_runs_at_a_tiny_size() -> None:
    result = host.run(services=50, endpoints=3, cold_runs=1, change_runs=3)
    cold, change, targets = result["cold"], result["change"], result["targets"]
    assert cold["virtual_servers"] > 50 and cold["real_servers"] == 3 * cold["virtual_servers"]
    for name in ("planner_s", "planner_us_per_service", "total_s", "us_per_real_server"):
        assert cold[name] > 0, name
    assert set(cold["phases_s"]) == set(host.PHASES)
    assert cold["messages"]["ipvs"] == cold["virtual_servers"] + cold["real_servers"]
    assert cold["messages"]["addresses"] > 0 and cold["messages"]["ipsets"] > 0
    for name in host.CHANGES:
        assert change[name]["planner_us"] > 0 and change[name]["total_us"] > 0, name
        assert change[name]["messages"] > 0, name
    assert change["endpoint_removed"]["reads"] == change["virtual_servers"]
    assert set(targets) == {
        "change_planner_us",
        "change_under_1ms",
        "change_total_us",
        "change_total_under_1ms",
        "cold_us_per_real_server",
        "cold_per_real_server_under_10us",
    }
    assert "us/real server" in host.table(result)


def test_pod_addresses_are_hosts_of_a_node_sized_subnet() -> None:
    """Pod IPs come from per-node /24s, so none is a /24's network or broadcast address: the
    kernel refuses those as real servers where the node's pod bridge holds that /24 (EINVAL:
    the lab node's cni0 is 10.244.1.1/24, and 10.244.1.255 was a real server)."""
    addresses = {synthetic.pod_ip(n) for n in range(70_000)}
    assert len(addresses) == synthetic.POD_ADDRESSES
    last_octets = {int(a.rsplit(".", 1)[1]) for a in addresses}
    assert last_octets == set(range(1, 255))
    assert all(ipaddress.ip_address(a) in POD_NET for a in addresses)
