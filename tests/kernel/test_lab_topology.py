"""The lab's cluster topology carries real traffic, and each node has its own IPVS and links.

These run inside the UML guest (see lab/uml/pytest_plugin.py); everything here is a real kernel.
"""

from __future__ import annotations

import subprocess

import pytest

from lab.net import netns
from lab.net.topology import Cluster

pytestmark = pytest.mark.kernel


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
