"""The lab's cluster topology carries real traffic, and each node has its own IPVS and links.

The topology is dual-stack: the IPv6 tests at the end send real TCP, UDP and SCTP over IPv6
between pods, nodes and the external client, and show the real control plane allocating IPv6
cluster IPs and the real EndpointSlice controller writing IPv6 slices from the lab pods.

These run inside the UML guest (see lab/uml/pytest_plugin.py); everything here is a real kernel.
"""

from __future__ import annotations

import contextlib
import ipaddress
import subprocess
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from lab.cluster.controlplane import SERVICE_CIDR, SERVICE_CIDR6, ControlPlane
from lab.cluster.kube import POD_ECHO_PORT, LabKube, wait_for
from lab.cluster.kubelet import LabPod
from lab.net import netns
from lab.net.topology import POD_SUPERNET6, UNDERLAY6, Cluster

pytestmark = pytest.mark.kernel

PROTOCOLS = [netns.tcp_request, netns.udp_request, netns.sctp_request]
PROTOCOL_IDS = ["tcp", "udp", "sctp"]


@pytest.mark.parametrize("request_fn", [netns.tcp_request, netns.udp_request], ids=["tcp", "udp"])
def test_pod_to_pod_same_node(lab_cluster: Cluster, request_fn: netns.RequestFn) -> None:
    client, server = lab_cluster.node("node-1").pods[:2]
    answer = request_fn(client.netns, server.ip, 8080)
    assert answer["pod"] == server.name
    # No NAT on the pod network: the server sees the client pod's own address.
    assert answer["client"].split(":")[0] == client.ip


@pytest.mark.parametrize("request_fn", [netns.tcp_request, netns.udp_request], ids=["tcp", "udp"])
def test_pod_to_pod_across_nodes(lab_cluster: Cluster, request_fn: netns.RequestFn) -> None:
    client = lab_cluster.node("node-1").pods[0]
    for node in lab_cluster.nodes[1:]:
        for server in node.pods:
            answer = request_fn(client.netns, server.ip, 8080)
            assert answer["pod"] == server.name
            assert answer["client"].split(":")[0] == client.ip


def test_external_reaches_each_node_address(lab_cluster: Cluster) -> None:
    ext = lab_cluster.external
    for node in lab_cluster.nodes:
        answer = netns.tcp_request(ext.netns, node.ip, 9090)
        assert answer["pod"] == node.name
        assert answer["client"].split(":")[0] == ext.ip


def test_external_is_not_a_node_and_cannot_reach_pods_directly(lab_cluster: Cluster) -> None:
    # The external client has no route to the pod network: only node addresses are reachable,
    # as for a client outside a real cluster.
    pod = lab_cluster.node("node-2").pods[0]
    with pytest.raises(OSError):
        netns.tcp_request(lab_cluster.external.netns, pod.ip, 8080, timeout=1.0)


def test_node_sysctls(lab_cluster: Cluster) -> None:
    for node in lab_cluster.nodes:
        assert netns.read_sysctl(node.netns, "net.ipv4.ip_forward") == "1"
        assert netns.read_sysctl(node.netns, "net.bridge.bridge-nf-call-iptables") == "1"


def test_nodes_forward_with_policy_drop_and_admit_pod_connections(lab_cluster: Cluster) -> None:
    for node in lab_cluster.nodes:
        rules = lab_cluster.exec(node.netns, "iptables", "-S", "FORWARD").stdout.splitlines()
        assert rules[0] == "-P FORWARD DROP"
        assert [r for r in rules if "--ctorigdst 10.244.0.0/16" in r or "--ctorigsrc" in r]


def _ipvs_table(cluster: Cluster, ns: str) -> str:
    return cluster.exec(ns, "ipvsadm", "-Ln").stdout


def test_ipvs_is_per_node(lab_cluster: Cluster) -> None:
    n1, n2 = lab_cluster.nodes[0].netns, lab_cluster.nodes[1].netns
    lab_cluster.exec(n1, "ipvsadm", "-A", "-t", "10.96.7.7:80", "-s", "rr")
    try:
        assert "10.96.7.7:80" in _ipvs_table(lab_cluster, n1)
        assert "10.96.7.7:80" not in _ipvs_table(lab_cluster, n2)
        assert (
            "10.96.7.7:80"
            not in subprocess.run(
                ["ipvsadm", "-Ln"], capture_output=True, text=True, check=True
            ).stdout
        )
    finally:
        lab_cluster.exec(n1, "ipvsadm", "-D", "-t", "10.96.7.7:80")


def test_dummy_device_can_be_created(lab_cluster: Cluster) -> None:
    ns = lab_cluster.nodes[2].netns
    lab_cluster.exec(ns, "ip", "link", "add", "kube-ipvs0", "type", "dummy")
    try:
        out = lab_cluster.exec(ns, "ip", "-o", "link", "show", "kube-ipvs0").stdout
        assert "kube-ipvs0" in out
        # Only in that node.
        other = lab_cluster.exec(lab_cluster.nodes[0].netns, "ip", "-o", "link", check=False)
        assert "kube-ipvs0" not in other.stdout
    finally:
        lab_cluster.exec(ns, "ip", "link", "del", "kube-ipvs0")


def test_traffic_through_ipvs_by_hand(lab_cluster: Cluster) -> None:
    """A hand-made virtual server on a dummy device forwards pod traffic to pods on two nodes,
    the way ipvsproxy will: the lab is fit for the dataplane's tests."""
    node = lab_cluster.node("node-1")
    backends = [node.pods[0], lab_cluster.node("node-2").pods[0]]
    client = node.pods[1]
    vip = "10.96.9.9"
    ns = node.netns
    # As ipvsproxy (and upstream) set it: IPVS connections are tracked, so the forwarded
    # replies belong to the pod's connection that the node's FORWARD rules admit.
    tracked = netns.read_sysctl(ns, "net.ipv4.vs.conntrack")
    netns.write_sysctl(ns, "net.ipv4.vs.conntrack", "1")
    lab_cluster.exec(ns, "ip", "link", "add", "kube-ipvs0", "type", "dummy")
    try:
        lab_cluster.exec(ns, "ip", "addr", "add", f"{vip}/32", "dev", "kube-ipvs0")
        lab_cluster.exec(ns, "ipvsadm", "-A", "-t", f"{vip}:80", "-s", "rr")
        for b in backends:
            lab_cluster.exec(ns, "ipvsadm", "-a", "-t", f"{vip}:80", "-r", f"{b.ip}:8080", "-m")
        seen = {netns.tcp_request(client.netns, vip, 80)["pod"] for _ in range(4)}
        assert seen == {b.name for b in backends}
    finally:
        lab_cluster.exec(ns, "ipvsadm", "-D", "-t", f"{vip}:80", check=False)
        lab_cluster.exec(ns, "ip", "link", "del", "kube-ipvs0", check=False)
        netns.write_sysctl(ns, "net.ipv4.vs.conntrack", tracked)


def test_iptables_is_the_legacy_backend() -> None:
    out = subprocess.run(["iptables", "--version"], capture_output=True, text=True, check=True)
    assert "legacy" in out.stdout
    # And the nat table, which the nft backend cannot create in this kernel, is usable.
    subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, check=True)


def test_sctp_pod_to_pod(lab_cluster: Cluster) -> None:
    client, server = lab_cluster.node("node-1").pods[0], lab_cluster.node("node-2").pods[1]
    answer = netns.sctp_request(client.netns, server.ip, 8080)
    assert (answer["pod"], answer["proto"]) == (server.name, "sctp")


# IPv6 ----------------------------------------------------------------------------------------


def _client_ip(answer: dict[str, Any]) -> str:
    return netns.split_hostport(answer["client"])[0]


def test_every_namespace_is_dual_stack(lab_cluster: Cluster) -> None:
    """Each namespace has its planned IPv6 address, usable at once (nodad: not tentative)."""
    hosts = [(n.netns, n.ip6, "eth0") for n in lab_cluster.nodes]
    hosts += [(n.netns, n.gateway6, "cni0") for n in lab_cluster.nodes]
    hosts += [(p.netns, p.ip6, "eth0") for p in lab_cluster.pods]
    hosts.append((lab_cluster.external.netns, lab_cluster.external.ip6, "eth0"))
    for ns, ip6, dev in hosts:
        assert ip6, ns
        out = lab_cluster.exec(ns, "ip", "-6", "-o", "addr", "show", "dev", dev, "scope", "global")
        assert f" {ip6}/" in out.stdout, (ns, out.stdout)
        assert "tentative" not in out.stdout
    for node in lab_cluster.nodes:
        assert ipaddress.ip_address(node.ip6) in UNDERLAY6
        assert ipaddress.IPv6Network(node.pod_cidr6).subnet_of(POD_SUPERNET6)
        for pod in node.pods:
            assert ipaddress.ip_address(pod.ip6) in ipaddress.ip_network(node.pod_cidr6)
    # Read alike: node-1 is .11 and ::11, pod-2-1 is 10.244.2.11 and fd00:10:244:2::11.
    assert lab_cluster.node("node-1").ip6 == "fc00:f853:ccd:e793::11"
    assert lab_cluster.pod("pod-2-1").ip6 == "fd00:10:244:2::11"
    assert lab_cluster.external.ip6 == "fc00:f853:ccd:e793::100"


def test_ipv6_node_sysctls_and_forward_policy(lab_cluster: Cluster) -> None:
    for node in lab_cluster.nodes:
        assert netns.read_sysctl(node.netns, "net.ipv6.conf.all.forwarding") == "1"
        assert netns.read_sysctl(node.netns, "net.bridge.bridge-nf-call-ip6tables") == "1"
        rules = lab_cluster.exec(node.netns, "ip6tables", "-S", "FORWARD").stdout.splitlines()
        assert rules[0] == "-P FORWARD DROP"
        assert [r for r in rules if f"--ctorigdst {POD_SUPERNET6}" in r]
        routes = lab_cluster.exec(node.netns, "ip", "-6", "route").stdout
        for other in lab_cluster.nodes:
            if other is not node:
                assert f"{other.pod_cidr6} via {other.ip6} dev eth0" in routes


@pytest.mark.parametrize("request_fn", PROTOCOLS, ids=PROTOCOL_IDS)
def test_ipv6_pod_to_pod_same_node(lab_cluster: Cluster, request_fn: netns.RequestFn) -> None:
    client, server = lab_cluster.node("node-1").pods[:2]
    answer = request_fn(client.netns, server.ip6, 8080)
    assert answer["pod"] == server.name
    assert _client_ip(answer) == client.ip6


@pytest.mark.parametrize("request_fn", PROTOCOLS, ids=PROTOCOL_IDS)
def test_ipv6_pod_to_pod_across_nodes(lab_cluster: Cluster, request_fn: netns.RequestFn) -> None:
    client = lab_cluster.node("node-1").pods[0]
    for node in lab_cluster.nodes[1:]:
        for server in node.pods:
            answer = request_fn(client.netns, server.ip6, 8080)
            assert answer["pod"] == server.name
            # No NAT on the pod network, in IPv6 either.
            assert _client_ip(answer) == client.ip6


@pytest.mark.parametrize("request_fn", PROTOCOLS, ids=PROTOCOL_IDS)
def test_ipv6_pod_to_node(lab_cluster: Cluster, request_fn: netns.RequestFn) -> None:
    """A pod reaches its own node and, routed by its node over the underlay, the others."""
    client = lab_cluster.node("node-2").pods[0]
    for node in lab_cluster.nodes:
        answer = request_fn(client.netns, node.ip6, 9090)
        assert answer["pod"] == node.name
        assert _client_ip(answer) == client.ip6


@pytest.mark.parametrize("request_fn", PROTOCOLS, ids=PROTOCOL_IDS)
def test_ipv6_external_to_node(lab_cluster: Cluster, request_fn: netns.RequestFn) -> None:
    ext = lab_cluster.external
    for node in lab_cluster.nodes:
        answer = request_fn(ext.netns, node.ip6, 9090)
        assert answer["pod"] == node.name
        assert _client_ip(answer) == ext.ip6


def test_ipv6_external_cannot_reach_pods_directly(lab_cluster: Cluster) -> None:
    pod = lab_cluster.node("node-2").pods[0]
    with pytest.raises(OSError):
        netns.tcp_request(lab_cluster.external.netns, pod.ip6, 8080, timeout=1.0)


@pytest.mark.parametrize("request_fn", PROTOCOLS, ids=PROTOCOL_IDS)
def test_ipv6_external_to_pod_routed_through_its_node(
    lab_cluster: Cluster, request_fn: netns.RequestFn
) -> None:
    """With a route to a pod via its node (what a test adds, as for IPv4), the external client
    reaches it unmasqueraded: the node forwards, its FORWARD rules admit a connection to a pod."""
    ext = lab_cluster.external
    node = lab_cluster.node("node-3")
    pod = node.pods[1]
    lab_cluster.exec(ext.netns, "ip", "-6", "route", "add", f"{pod.ip6}/128", "via", node.ip6)
    try:
        answer = request_fn(ext.netns, pod.ip6, 8080)
        assert answer["pod"] == pod.name
        assert _client_ip(answer) == ext.ip6
    finally:
        lab_cluster.exec(ext.netns, "ip", "-6", "route", "del", f"{pod.ip6}/128", check=False)


def test_ipv4_answers_are_unchanged_by_the_ipv6_listeners(lab_cluster: Cluster) -> None:
    """An IPv4 client is still seen as itself (never as ::ffff:a.b.c.d) on every protocol."""
    client, server = lab_cluster.node("node-1").pods[0], lab_cluster.node("node-2").pods[0]
    for request_fn in PROTOCOLS:
        answer = request_fn(client.netns, server.ip, 8080)
        host, port = answer["client"].split(":")
        assert host == client.ip and port.isdigit()
        assert answer["server"].split(":")[1] == "8080"


# Dual-stack Services with the real control plane ----------------------------------------------


@pytest.fixture(scope="module")
def dual_stack_kube(
    lab_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LabKube]:
    """The real control plane (no proxy) with every lab pod registered dual-stack, app=dual."""
    lab = LabKube(lab_cluster, tmp_path_factory.mktemp("dual-stack"))
    try:
        lab.start_apiserver()
        lab.start_controller(
            [
                LabPod(p.name, "default", p.node, p.ip, {"app": "dual"}, {"echo": 8080}, ip6=p.ip6)
                for p in lab_cluster.pods
            ]
        )
        yield lab
    finally:
        with contextlib.suppress(Exception):
            print(lab.controlplane.log_tail("kube-controller-manager"))
        lab.stop()


def _service(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "selector": {"app": "dual"},
            "ports": [{"name": "echo", "port": 80, "targetPort": "echo", "protocol": "TCP"}],
            **spec,
        },
    }


def _slices(cp: ControlPlane, service: str) -> dict[str, set[str]]:
    """The addresses of the Service's EndpointSlices, by address type."""
    out = cp.call(
        "GET",
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
        f"?labelSelector=kubernetes.io/service-name%3D{service}",
    )
    by_type: dict[str, set[str]] = {}
    for item in out["items"]:
        addrs = by_type.setdefault(item["addressType"], set())
        for ep in item.get("endpoints") or []:
            addrs.update(ep["addresses"])
    return by_type


def _slices_are(cp: ControlPlane, service: str, expected: dict[str, set[str]]) -> bool:
    return _slices(cp, service) == expected


def test_node_and_pod_objects_are_dual_stack(
    lab_cluster: Cluster, dual_stack_kube: LabKube
) -> None:
    cp = dual_stack_kube.controlplane
    for node in lab_cluster.nodes:
        got = cp.call("GET", f"/api/v1/nodes/{node.name}")["status"]["addresses"]
        internal = [a["address"] for a in got if a["type"] == "InternalIP"]
        assert internal == [node.ip, node.ip6]
    for pod in lab_cluster.pods:
        status = cp.call("GET", f"/api/v1/namespaces/default/pods/{pod.name}")["status"]
        assert status["podIP"] == pod.ip
        assert [p["ip"] for p in status["podIPs"]] == [pod.ip, pod.ip6]


# name: (spec fields, families of its cluster IPs, explicit cluster IPs or None)
SERVICES: dict[str, tuple[dict[str, Any], list[str], list[str] | None]] = {
    "v4": ({}, ["IPv4"], None),
    "v6": ({"ipFamilies": ["IPv6"]}, ["IPv6"], None),
    "v6-explicit": (
        {"ipFamilies": ["IPv6"], "clusterIP": "fd00:10:96::a"},
        ["IPv6"],
        ["fd00:10:96::a"],
    ),
    "prefer-dual": ({"ipFamilyPolicy": "PreferDualStack"}, ["IPv4", "IPv6"], None),
    "require-dual": ({"ipFamilyPolicy": "RequireDualStack"}, ["IPv4", "IPv6"], None),
    "require-dual-v6-first": (
        {"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv6", "IPv4"]},
        ["IPv6", "IPv4"],
        None,
    ),
    "dual-explicit": (
        {
            "ipFamilyPolicy": "RequireDualStack",
            "clusterIP": "10.96.100.100",
            "clusterIPs": ["10.96.100.100", "fd00:10:96::100"],
        },
        ["IPv4", "IPv6"],
        ["10.96.100.100", "fd00:10:96::100"],
    ),
}


def test_ipv6_and_dual_stack_services_get_ipv6_endpoint_slices(
    lab_cluster: Cluster, dual_stack_kube: LabKube
) -> None:
    """Services of every family policy are created, with allocated and with explicit cluster
    IPs from the right ranges, and the real EndpointSlice controller gives each family of a
    Service its own slice: the IPv6 one holds the lab pods' IPv6 addresses, which answer."""
    cp = dual_stack_kube.controlplane
    ranges = {
        "IPv4": ipaddress.ip_network(SERVICE_CIDR),
        "IPv6": ipaddress.ip_network(SERVICE_CIDR6),
    }
    for name, (spec, families, explicit) in SERVICES.items():
        made = cp.call("POST", "/api/v1/namespaces/default/services", _service(name, **spec))
        assert made["spec"]["ipFamilies"] == families, name
        ips = made["spec"]["clusterIPs"]
        assert made["spec"]["clusterIP"] == ips[0]
        assert len(ips) == len(families)
        for ip, family in zip(ips, families, strict=True):
            assert ipaddress.ip_address(ip) in ranges[family], (name, ip)
        if explicit is not None:
            assert ips == explicit
    want = {
        "IPv4": {p.ip for p in lab_cluster.pods},
        "IPv6": {p.ip6 for p in lab_cluster.pods},
    }
    for name, (_, families, _) in SERVICES.items():
        expected = {f: want[f] for f in families}
        wait_for(partial(_slices_are, cp, name, expected), 60, f"the slices of {name}")
    assert dual_stack_kube.controlplane.running("kube-controller-manager")
    # The IPv6 endpoints are the lab pods, and they answer there.
    by_ip6 = {p.ip6: p for p in lab_cluster.pods}
    client = lab_cluster.node("node-1").pods[0]
    for ip6 in sorted(_slices(cp, "v6")["IPv6"]):
        assert netns.tcp_request(client.netns, ip6, POD_ECHO_PORT)["pod"] == by_ip6[ip6].name
