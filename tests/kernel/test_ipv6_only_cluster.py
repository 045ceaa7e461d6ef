"""An IPv6-only cluster with real traffic: the lab without its IPv4 half (no IPv4 address on any
node, pod or external interface but lo's 127.0.0.1), the API server reached over IPv6 with only
the IPv6 Service range (a Service that names no family is IPv6), Nodes and Pods with IPv6
addresses only, and ``ipvsproxy run --cluster-cidr fd00:10:244::/48`` on every node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from lab.cluster.kube import HEALTHZ_PORT, LabKube, echo_pods, http_get_from
from lab.net.topology import Cluster, Node
from tests.kernel.test_ipv6_services import (
    answered,
    ask,
    core,
    eventually,
    ipvsproxy,
    node_port,
    ports,
)

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.parametrize("lab_cluster", ["ipv6-only"], indirect=True),
]

APP = "only6"


@pytest.fixture(scope="module")
def kube(lab_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabKube]:
    """The IPv6-only control plane, Nodes with their IPv6 pod CIDRs, every lab pod (IPv6 only)
    labelled app=only6 and at=<its node>, the daemons."""
    lab = LabKube(lab_cluster, tmp_path_factory.mktemp("ipv6only"), pod_cidrs=True)
    pods = echo_pods(lab_cluster, lambda p: {"app": APP, "at": p.node})
    try:
        yield lab.start(pods)
    finally:
        print(lab.logs())  # shown with a failure's report
        lab.stop(cleanup=True)


def create(kube: LabKube, name: str, spec: dict[str, Any], **selector: str) -> Any:
    """A Service of the lab pods (those of ``selector`` too), as the API server defaults it."""
    body = {"metadata": {"name": name}, "spec": {"selector": {"app": APP, **selector}, **spec}}
    core(kube).create_namespaced_service("default", body)
    return core(kube).read_namespaced_service(name, "default")


def delete(kube: LabKube, *names: str) -> None:
    for name in names:
        core(kube).delete_namespaced_service(name, "default")


def everyone(cluster: Cluster) -> set[str]:
    return {p.name for p in cluster.pods}


def node_addresses(cluster: Cluster) -> set[str]:
    """What a masqueraded connection's source becomes: a node's eth0 or cni0 address."""
    return {n.ip6 for n in cluster.nodes} | {n.gateway6 for n in cluster.nodes}


def the_slices(kube: LabKube, service: str) -> set[tuple[str, str]]:
    from kubernetes import client

    found = client.DiscoveryV1Api(kube.api).list_namespaced_endpoint_slice(
        "default", label_selector=f"kubernetes.io/service-name={service}"
    )
    return {
        (s.address_type, a) for s in found.items for e in s.endpoints or [] for a in e.addresses
    }


def test_the_lab_is_ipv6_only(lab_cluster: Cluster, kube: LabKube) -> None:
    """No IPv4 address anywhere but lo's 127.0.0.1; the API server is reached over IPv6 and its
    Nodes, Pods and default Service range are IPv6 only."""
    namespaces = [n.netns for n in lab_cluster.nodes] + [p.netns for p in lab_cluster.pods]
    for ns in [*namespaces, lab_cluster.external.netns]:
        out = lab_cluster.exec(ns, "ip", "-4", "-o", "address", "show").stdout
        assert re.findall(r"inet (\S+)", out) == ["127.0.0.1/8"], (ns, out)
    server = json.loads(kube.daemon_kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    assert server == f"https://[{lab_cluster.root_ip6}]:6443"
    for node in core(kube).list_node().items:
        assert [a.address for a in node.status.addresses if a.type == "InternalIP"] == [
            lab_cluster.node(node.metadata.name).ip6
        ]
        assert node.spec.pod_cidrs == [lab_cluster.node(node.metadata.name).pod_cidr6]
    for pod in core(kube).list_namespaced_pod("default").items:
        assert [p.ip for p in pod.status.pod_ips] == [lab_cluster.pod(pod.metadata.name).ip6]
    assert ":" in core(kube).read_namespaced_service("kubernetes", "default").spec.cluster_ip


def test_a_service_naming_no_family_is_ipv6_and_pods_and_nodes_reach_it(
    lab_cluster: Cluster, kube: LabKube
) -> None:
    svc = create(kube, "plain", {"ports": ports("TCP", "UDP", "SCTP")})
    try:
        vip = svc.spec.cluster_ip
        assert svc.spec.ip_families == ["IPv6"] and svc.spec.cluster_ips == [vip], svc.spec
        # The real EndpointSlice controller writes an IPv6 slice of the pods' IPv6 addresses.
        want = {("IPv6", p.ip6) for p in lab_cluster.pods}
        eventually(lambda: the_slices(kube, "plain") == want, "the IPv6 EndpointSlice")
        for node in lab_cluster.nodes:
            for ns in (node.pods[-1].netns, node.netns):
                for i, proto in enumerate(("TCP", "UDP", "SCTP")):
                    check = partial(
                        lambda n, p, pr: answered(n, vip, p, pr) == everyone(lab_cluster),
                        ns,
                        80 + i,
                        proto,
                    )
                    eventually(check, f"{proto} [{vip}]:{80 + i} from {ns}")
        # A pod's connection keeps its address (it is in clusterCIDR: not masqueraded).
        node = lab_cluster.nodes[0]
        pod = node.pods[-1]
        seen = [ask(pod.netns, vip, 80) for _ in range(12)]
        remote = {c for p, c in seen if p and not p.startswith(f"pod-{node.index}-")}
        assert remote == {pod.ip6}, seen
    finally:
        delete(kube, "plain")


def test_node_ports_are_masqueraded_from_pods_nodes_and_outside(
    lab_cluster: Cluster, kube: LabKube
) -> None:
    svc = create(kube, "np", {"type": "NodePort", "ports": ports("TCP", "UDP", "SCTP")})
    try:
        assert svc.spec.ip_families == ["IPv6"]
        first = lab_cluster.nodes[0]
        clients = {
            "external": (lab_cluster.external.netns, lab_cluster.external.ip6),
            "pod": (first.pods[-1].netns, first.pods[-1].ip6),
            "node": (first.netns, first.ip6),
        }
        masq = node_addresses(lab_cluster)
        for proto in ("TCP", "UDP", "SCTP"):
            np = node_port(svc, proto.lower())
            for node in lab_cluster.nodes:
                for what, (ns, own) in clients.items():
                    check = partial(
                        lambda n, a, p, pr: answered(n, a, p, pr) == everyone(lab_cluster),
                        ns,
                        node.ip6,
                        np,
                        proto,
                    )
                    eventually(check, f"{proto} [{node.ip6}]:{np} from {what}")
                    seen = {c for _, c in (ask(ns, node.ip6, np, proto) for _ in range(6))}
                    assert seen <= masq, (what, node.name, proto, seen)
                    if what != "node":  # (a node's own address is a node address anyway)
                        assert own not in seen, (what, node.name, proto, seen)
    finally:
        delete(kube, "np")


def test_a_load_balancer_vip_answers_outside_masqueraded(
    lab_cluster: Cluster, kube: LabKube
) -> None:
    ext, node = lab_cluster.external, lab_cluster.nodes[1]
    vip = "2001:db8::40"
    create(kube, "lb", {"type": "LoadBalancer", "ports": ports("TCP", "UDP")})
    body = {"status": {"loadBalancer": {"ingress": [{"ip": vip}]}}}
    core(kube).patch_namespaced_service_status("lb", "default", body)
    lab_cluster.exec(ext.netns, "ip", "-6", "route", "replace", f"{vip}/128", "via", node.ip6)
    try:
        for i, proto in enumerate(("TCP", "UDP")):
            check = partial(
                lambda p, pr: answered(ext.netns, vip, p, pr) == everyone(lab_cluster),
                80 + i,
                proto,
            )
            eventually(check, f"{proto} [{vip}]:{80 + i} from outside")
            seen = {c for _, c in (ask(ext.netns, vip, 80 + i, proto) for _ in range(6))}
            assert seen <= node_addresses(lab_cluster), (proto, seen)
    finally:
        lab_cluster.exec(ext.netns, "ip", "-6", "route", "del", f"{vip}/128", check=False)
        delete(kube, "lb")


def test_external_traffic_policy_local_keeps_the_clients_address_and_health_checks(
    lab_cluster: Cluster, kube: LabKube
) -> None:
    """Pods of node-2 only: node-2 answers with the client's own address kept, on its NodePort
    and through the load balancer's VIP; node-1 forwards nothing. The health-check node port
    answers over IPv6 (what a load balancer probes): 200 on node-2, 503 on node-1."""
    ext = lab_cluster.external
    n1, n2 = lab_cluster.nodes[0], lab_cluster.nodes[1]
    vip = "2001:db8::41"
    spec = {"type": "LoadBalancer", "externalTrafficPolicy": "Local", "ports": ports("TCP", "UDP")}
    svc = create(kube, "local", spec, at=n2.name)
    body = {"status": {"loadBalancer": {"ingress": [{"ip": vip}]}}}
    core(kube).patch_namespaced_service_status("local", "default", body)
    lab_cluster.exec(ext.netns, "ip", "-6", "route", "replace", f"{vip}/128", "via", n2.ip6)
    local = {p.name for p in n2.pods}
    try:
        for i, proto in enumerate(("TCP", "UDP")):
            for address, port in ((n2.ip6, node_port(svc, proto.lower())), (vip, 80 + i)):
                check = partial(
                    lambda a, p, pr: answered(ext.netns, a, p, pr) == local, address, port, proto
                )
                eventually(check, f"{proto} [{address}]:{port} from outside")
                seen = {c for _, c in (ask(ext.netns, address, port, proto) for _ in range(4))}
                assert seen == {ext.ip6}, (proto, address, seen)
            assert ask(ext.netns, n1.ip6, node_port(svc, proto.lower()), proto)[0] == ""
        hc = svc.spec.health_check_node_port

        def probe(node: Node) -> tuple[int, str]:
            return http_get_from(ext.netns, f"http://[{node.ip6}]:{hc}/")

        eventually(lambda: probe(n2)[0] == 200, "health check 200 on node-2")
        assert json.loads(probe(n2)[1])["localEndpoints"] == 2
        eventually(lambda: probe(n1)[0] == 503, "health check 503 on node-1")
    finally:
        lab_cluster.exec(ext.netns, "ip", "-6", "route", "del", f"{vip}/128", check=False)
        delete(kube, "local")


def health(node: Node, host: str, path: str = "/healthz") -> tuple[int, Any]:
    code, body = http_get_from(node.netns, f"http://{host}:{HEALTHZ_PORT}{path}")
    return code, json.loads(body)


def test_the_health_server_answers_on_both_families_of_the_node(
    lab_cluster: Cluster, kube: LabKube
) -> None:
    """--healthz-bind-address 0.0.0.0:10256 (deploy/'s) listens as upstream's does (Go's
    net.Listen on 0.0.0.0 takes both families): on 127.0.0.1, on [::1], and on the node's IPv6
    address, where the kubelet probes a hostNetwork pod on an IPv6-only node."""
    for node in lab_cluster.nodes:
        for host in ("127.0.0.1", "[::1]", f"[{node.ip6}]"):
            for path in ("/healthz", "/livez"):
                code, body = health(node, host, path)
                assert code == 200, (node.name, host, path, body)
                assert "unservedIPFamilies" not in body, (node.name, body)
        body = health(node, f"[{node.ip6}]")[1]
        assert body["nodeEligible"] is True
        # IPv4 is served (the kernel has it), but no address of the node carries its NodePorts.
        assert list(body["noNodePortAddressIPFamilies"]) == ["IPv4"], body


def test_the_daemon_names_its_ipv6_node_ip_and_status_shows_ipv6_only(
    lab_cluster: Cluster, kube: LabKube
) -> None:
    svc = create(kube, "shown", {"type": "NodePort", "ports": ports("TCP", "UDP")})
    assert kube.daemons is not None
    vip, tcp, udp = svc.spec.cluster_ip, node_port(svc, "tcp"), node_port(svc, "udp")
    try:
        for node in lab_cluster.nodes:
            log = (kube.workdir / f"{node.name}.log").read_text()
            assert f"ipvsproxy on node {node.name}, node IP {node.ip6}" in log, log[-3000:]
            assert "can't determine this node's IP" not in log, log[-3000:]
            # The cluster IP, and the NodePorts on the node's addresses (eth0's and cni0's).
            want = {f"[{vip}]:80", f"[{vip}]:81"} | {
                f"[{a}]:{p}" for a in (node.ip6, node.gateway6) for p in (tcp, udp)
            }
            argv = ["status", "--state-file", str(kube.daemons.state_file(node))]

            def shown(argv: list[str] = argv, node: Node = node, want: set[str] = want) -> bool:
                report = json.loads(ipvsproxy(lab_cluster, node, *argv, "--output", "json"))
                mine = [v for v in report["virtualServers"] if v["service"] == "default/shown"]
                got = {f"[{v['address']}]:{v['port']}" for v in mine}
                return got == want and report["drift"]["count"] == 0

            eventually(shown, f"status of {node.name}")
            table = ipvsproxy(lab_cluster, node, *argv, "-n")
            rows = {ln.split()[1] for ln in table.splitlines() if "default/shown:" in ln}
            assert rows == want, table
            saved = lab_cluster.exec(node.netns, "ipvsadm", "-Sn").stdout.splitlines()
            assert not [ln for ln in saved if re.match(r"-A -[tus] \d", ln)], saved  # no IPv4
    finally:
        delete(kube, "shown")
