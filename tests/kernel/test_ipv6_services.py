"""IPv6 and dual-stack Services with real traffic: the dual-stack lab (every node, pod and the
external client with an address of each family), the real control plane allocating IPv6
cluster IPs from fd00:10:96::/112, the real EndpointSlice controller writing IPv6 slices, and
``ipvsproxy run`` on every node serving both families.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

from lab.cluster.kube import ECHO_PORT_NAMES, LabKube, echo_pods, wait_for
from lab.net import netns
from lab.net.topology import Cluster, Node

pytestmark = pytest.mark.kernel

PROTOCOLS = {"TCP": netns.tcp_request, "UDP": netns.udp_request, "SCTP": netns.sctp_request}
NAMED = ECHO_PORT_NAMES


@pytest.fixture(scope="module")
def kube(lab_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabKube]:
    """The dual-stack control plane, every lab pod (both addresses) labelled app=six, the
    daemons."""
    lab = LabKube(lab_cluster, tmp_path_factory.mktemp("ipv6"))
    pods = echo_pods(lab_cluster, lambda p: {"app": "six"})
    try:
        yield lab.start(pods)
    finally:
        print(lab.logs())  # shown with a failure's report
        lab.stop(cleanup=True)


def core(kube: LabKube) -> Any:
    from kubernetes import client

    return client.CoreV1Api(kube.api)


def create(kube: LabKube, name: str, spec: dict[str, Any]) -> Any:
    body = {"metadata": {"name": name}, "spec": {"selector": {"app": "six"}, **spec}}
    core(kube).create_namespaced_service("default", body)
    return core(kube).read_namespaced_service(name, "default")


def ports(*protocols: str) -> list[dict[str, Any]]:
    out = []
    for i, proto in enumerate(protocols):
        p: dict[str, Any] = {
            "name": proto.lower(),
            "port": 80 + i,
            "protocol": proto,
            "targetPort": NAMED[proto],
        }
        out.append(p)
    return out


def ask(ns: str, host: str, port: int, proto: str = "TCP") -> tuple[str, str]:
    """(the pod that answered, the client address it saw); ("", why) when none did."""
    try:
        answer = PROTOCOLS[proto](ns, host, port, timeout=2)
    except OSError as exc:
        return "", type(exc).__name__
    host_seen, _ = netns.split_hostport(str(answer["client"]))
    return str(answer["pod"]), host_seen


def answered(ns: str, host: str, port: int, proto: str = "TCP", n: int = 12) -> set[str]:
    return {ask(ns, host, port, proto)[0] for _ in range(n)}


def eventually(check: Callable[[], bool], what: str) -> None:
    wait_for(check, 30, what)


def everyone(cluster: Cluster) -> set[str]:
    return {p.name for p in cluster.pods}


def on(cluster: Cluster, node: Node) -> set[str]:
    return {p.name for p in cluster.pods if p.node == node.name}


def ipvsproxy(cluster: Cluster, node: Node, *argv: str) -> str:
    proc = cluster.exec(node.netns, sys.executable, "-m", "ipvsproxy", *argv, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def node_port(svc: Any, name: str) -> int:
    return int(next(p.node_port for p in svc.spec.ports if p.name == name))


def test_an_ipv6_only_service_answers_every_protocol_from_pods_nodes_and_outside(
    lab_cluster: Cluster, kube: LabKube
) -> None:
    svc = create(
        kube,
        "six",
        {
            "type": "NodePort",
            "ipFamilies": ["IPv6"],
            "ipFamilyPolicy": "SingleStack",
            "ports": ports("TCP", "UDP", "SCTP"),
        },
    )
    vip = svc.spec.cluster_ip
    assert ":" in vip and svc.spec.cluster_ips == [vip]
    pods = everyone(lab_cluster)
    for i, proto in enumerate(("TCP", "UDP", "SCTP")):
        for node in lab_cluster.nodes:
            for ns in (node.pods[-1].netns, node.netns):
                check = partial(
                    lambda ns, p, pr: answered(ns, vip, p, pr) == pods, ns, 80 + i, proto
                )
                eventually(check, f"{proto} [{vip}]:{80 + i} from {ns}")
        # From outside, through each node's IPv6 address: masqueraded (the client seen is
        # not the external client), as a NodePort with externalTrafficPolicy Cluster is.
        np = node_port(svc, proto.lower())
        for node in lab_cluster.nodes:
            seen = [ask(lab_cluster.external.netns, node.ip6, np, proto) for _ in range(6)]
            assert all(pod for pod, _ in seen), (node.name, proto, seen)
            assert lab_cluster.external.ip6 not in {client for _, client in seen}
    # ipvsproxy status shows it as ipvsadm does, and the kernel as the daemon wants it.
    node = lab_cluster.nodes[0]
    assert kube.daemons is not None
    argv = ["status", "--state-file", str(kube.daemons.state_file(node))]
    table = ipvsproxy(lab_cluster, node, *argv, "-n")
    assert f"[{vip}]:80" in table and "default/six:tcp" in table, table
    report = json.loads(ipvsproxy(lab_cluster, node, *argv, "--output", "json"))
    assert report["drift"]["count"] == 0, report["drift"]
    six = [vs for vs in report["virtualServers"] if vs["service"] == "default/six"]
    assert {vs["address"] for vs in six if vs["role"] == "ClusterIP"} == {vip}
    assert all(vs["topology"] == "Cluster" for vs in six), six
    # Nothing of it in IPv4: its NodePorts are IPv6 virtual servers only.
    saved = lab_cluster.exec(lab_cluster.nodes[0].netns, "ipvsadm", "-Sn").stdout.splitlines()
    mine = [ln for ln in saved if ln.startswith("-A ") and f":{node_port(svc, 'tcp')} " in ln]
    assert mine and all("[" in ln for ln in mine), mine
    core(kube).delete_namespaced_service("six", "default")


def test_dual_stack_external_traffic_policy_local_keeps_the_clients_ipv6_address(
    lab_cluster: Cluster, kube: LabKube
) -> None:
    svc = create(
        kube,
        "dual",
        {
            "type": "NodePort",
            "ipFamilyPolicy": "RequireDualStack",
            "externalTrafficPolicy": "Local",
            "ports": ports("TCP"),
        },
    )
    v4, v6 = svc.spec.cluster_ips
    assert ":" not in v4 and ":" in v6
    np = node_port(svc, "tcp")
    ext = lab_cluster.external
    client_pod = lab_cluster.nodes[0].pods[-1].netns
    for vip in (v4, v6):
        want = everyone(lab_cluster)
        eventually(partial(lambda vip, want: answered(client_pod, vip, 80) == want, vip, want), vip)
    for node in lab_cluster.nodes:
        local = on(lab_cluster, node)
        for address, client in ((node.ip6, ext.ip6), (node.ip, ext.ip)):
            check = partial(lambda a, w: answered(ext.netns, a, np) == w, address, local)
            eventually(check, f"{node.name} {address}")
            seen = {ask(ext.netns, address, np)[1] for _ in range(4)}
            assert seen == {client}, (node.name, address, seen)
    core(kube).delete_namespaced_service("dual", "default")


def test_an_ipv6_external_ip_answers_pods_nodes_and_outside(
    lab_cluster: Cluster, kube: LabKube
) -> None:
    ext, node = lab_cluster.external, lab_cluster.nodes[2]
    address = "2001:db8::9"
    create(
        kube,
        "ext",
        {
            "ipFamilies": ["IPv6"],
            "ipFamilyPolicy": "SingleStack",
            "externalIPs": [address],
            "ports": ports("TCP", "UDP"),
        },
    )
    lab_cluster.exec(ext.netns, "ip", "-6", "route", "replace", f"{address}/128", "via", node.ip6)
    try:
        pods = everyone(lab_cluster)
        for ns in (node.pods[-1].netns, node.netns, ext.netns):
            for i, proto in enumerate(("TCP", "UDP")):
                check = partial(
                    lambda n, p, pr: answered(n, address, p, pr) == pods, ns, 80 + i, proto
                )
                eventually(check, f"{proto} [{address}]:{80 + i} from {ns}")
        # From outside: masqueraded (externalTrafficPolicy Cluster).
        assert ext.ip6 not in {ask(ext.netns, address, 80)[1] for _ in range(4)}
    finally:
        lab_cluster.exec(ext.netns, "ip", "-6", "route", "del", f"{address}/128", check=False)
        core(kube).delete_namespaced_service("ext", "default")


def test_ipv6_affinity_hairpin_and_source_ranges(lab_cluster: Cluster, kube: LabKube) -> None:
    ext = lab_cluster.external
    node = lab_cluster.nodes[1]
    client = node.pods[-1]
    six = {"ipFamilies": ["IPv6"], "ipFamilyPolicy": "SingleStack"}
    # ClientIP affinity: a client sticks to one pod (persistence per /128).
    sticky = create(kube, "sticky", {**six, "ports": ports("TCP"), "sessionAffinity": "ClientIP"})
    eventually(lambda: len(answered(client.netns, sticky.spec.cluster_ip, 80)) == 1, "affinity")
    # Hairpin: a pod reaches itself through its Service (KUBE-6-LOOP-BACK masquerades it).
    core(kube).patch_namespaced_service("sticky", "default", {"spec": {"sessionAffinity": "None"}})
    eventually(
        lambda: client.name in answered(client.netns, sticky.spec.cluster_ip, 80, n=24),
        "hairpin",
    )
    # A load balancer's IPv6 VIP admits its source ranges only: the external client's /128.
    vip = "2001:db8::30"
    fw = create(
        kube,
        "fw",
        {
            **six,
            "type": "LoadBalancer",
            "ports": ports("TCP"),
            "loadBalancerSourceRanges": [f"{ext.ip6}/128"],
        },
    )
    body = {"status": {"loadBalancer": {"ingress": [{"ip": vip}]}}}
    core(kube).patch_namespaced_service_status("fw", "default", body)
    lab_cluster.exec(ext.netns, "ip", "-6", "route", "replace", f"{vip}/128", "via", node.ip6)
    try:
        eventually(lambda: answered(ext.netns, vip, 80) == everyone(lab_cluster), "in range")
        # A pod is not in the range: dropped.
        assert ask(client.netns, vip, 80) == ("", "TimeoutError")
        assert fw.spec.cluster_ip and ":" in fw.spec.cluster_ip
    finally:
        lab_cluster.exec(ext.netns, "ip", "-6", "route", "del", f"{vip}/128", check=False)
        core(kube).delete_namespaced_service("fw", "default")
        core(kube).delete_namespaced_service("sticky", "default")


def test_the_ipv6_local_traffic_detector_masquerades_only_traffic_from_outside_the_pods(
    lab_cluster: Cluster, kube: LabKube
) -> None:
    """clusterCIDR's IPv6 half (the lab's fd00:10:244::/48) tells pod traffic from the rest:
    a pod reaches an IPv6 cluster IP with its own address, a client outside the pods' range
    routed to it through a node is masqueraded (without the detector it would not be)."""
    ext, node = lab_cluster.external, lab_cluster.nodes[0]
    svc = create(
        kube,
        "detect",
        {"ipFamilies": ["IPv6"], "ipFamilyPolicy": "SingleStack", "ports": ports("TCP")},
    )
    vip = svc.spec.cluster_ip
    pod = node.pods[-1]
    lab_cluster.exec(ext.netns, "ip", "-6", "route", "replace", f"{vip}/128", "via", node.ip6)
    try:
        eventually(lambda: bool(ask(pod.netns, vip, 80)[0]), "the cluster IP answers")
        remote = [(p, c) for p, c in (ask(pod.netns, vip, 80) for _ in range(12)) if p]
        # Answered by a pod of another node: the client seen is the pod itself.
        others = {c for p, c in remote if not p.startswith(f"pod-{node.index}-")}
        assert others == {pod.ip6}, remote
        eventually(lambda: bool(ask(ext.netns, vip, 80)[0]), "the cluster IP from outside")
        seen = {c for p, c in (ask(ext.netns, vip, 80) for _ in range(6)) if p}
        assert seen and ext.ip6 not in seen, seen
    finally:
        lab_cluster.exec(ext.netns, "ip", "-6", "route", "del", f"{vip}/128", check=False)
        core(kube).delete_namespaced_service("detect", "default")
