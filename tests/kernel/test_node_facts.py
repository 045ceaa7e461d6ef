"""Node facts in the lab: the node IP comes from the Node object (upstream's detectNodeIPs), and
NodePorts follow the node's addresses as they change."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.cluster.kube import LabKube, http_get_from, wait_for
from lab.net import netns
from lab.net.topology import Cluster, Node

pytestmark = pytest.mark.kernel


def node_object(node: Node) -> dict[str, Any]:
    """As a kubelet registers it: an ExternalIP listed first, the InternalIP after it."""
    return {
        "metadata": {"name": node.name},
        "status": {
            "addresses": [
                {"type": "Hostname", "address": node.name},
                {"type": "ExternalIP", "address": "198.51.100.1"},
                {"type": "InternalIP", "address": node.ip},
            ]
        },
    }


def selectorless(core: Any, disc: Any, name: str, spec: dict[str, Any], pod: Any) -> Any:
    """A Service without a selector and its hand-written slice (the pod's echo port)."""
    core.create_namespaced_service("default", {"metadata": {"name": name}, "spec": spec})
    disc.create_namespaced_endpoint_slice(
        "default",
        {
            "metadata": {"name": f"{name}-1", "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": [pod.ip], "nodeName": pod.node, "conditions": {"ready": True}}
            ],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        },
    )
    return core.read_namespaced_service(name, "default")


@pytest.fixture
def primary(lab_cluster: Cluster, tmp_path: Path) -> Iterator[LabKube]:
    """Daemons with ``nodePortAddresses: [primary]``, every Node object registered first."""
    from kubernetes import client

    lab = LabKube(
        lab_cluster,
        tmp_path,
        daemon_flags=("--watch-timeout", "3s", "--nodeport-addresses", "primary"),
        register_nodes=False,
    )
    lab.start_apiserver()
    lab.start_controller()
    core: Any = client.CoreV1Api(lab.api)
    for node in lab_cluster.nodes:
        core.create_node(node_object(node))
    try:
        yield lab
    finally:
        print(lab.logs())
        lab.stop(cleanup=True)


def test_primary_node_port_address_is_the_nodes_internal_ip(
    lab_cluster: Cluster, primary: LabKube
) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(primary.api)
    disc: Any = client.DiscoveryV1Api(primary.api)
    n1 = lab_cluster.nodes[0]
    primary.start_daemons()
    primary.wait_first_sync(n1)
    svc = selectorless(
        core,
        disc,
        "lb",
        {
            "type": "LoadBalancer",
            "externalTrafficPolicy": "Local",
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30510}],
        },
        n1.pods[0],
    )
    hc = svc.spec.health_check_node_port
    ext = lab_cluster.external
    wait_for(
        lambda: netns.tcp_request(ext.netns, n1.ip, 30510, timeout=2)["pod"] == "pod-1-1",
        30,
        "NodePort on the node's InternalIP",
    )
    table = lab_cluster.exec(n1.netns, "ipvsadm", "-Ln").stdout
    assert f"{n1.ip}:30510" in table
    assert f"{n1.gateway}:30510" not in table, table  # the pod bridge is not the node's IP
    # The health-check node port listens on the node-port addresses only (A5).
    wait_for(lambda: http_get_from(ext.netns, f"http://{n1.ip}:{hc}/")[0] == 200, 30, "hc")
    with pytest.raises(OSError):
        netns.tcp_request(n1.pods[1].netns, n1.gateway, hc, timeout=2)


LINK_LOCAL = "169.254.77.7"


def test_node_ports_and_local_decisions_follow_the_nodes_addresses(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    """An address added to eth0 after start (DHCP, keepalived, kube-vip) carries the NodePorts
    by the next sync, and goes with them when removed; an externalIP that becomes a node
    address is refused (no virtual server, not bound to kube-ipvs0: it would take the node's
    own port), and is programmed again when the node lets it go; one equal to the API
    server's address (as the daemon reaches it) is never programmed. An IPv4 link-local
    address carries NodePorts too, as upstream's."""
    from kubernetes import client

    lab = LabKube(
        lab_cluster, tmp_path, daemon_flags=("--watch-timeout", "3s", "--ipvs-sync-period", "2s")
    )
    lab.start_apiserver()
    lab.start_controller()
    n1, ext = lab_cluster.nodes[0], lab_cluster.external
    added, vip, api = "192.168.56.211", "192.168.56.212", lab_cluster.apiserver_ip
    try:
        core: Any = client.CoreV1Api(lab.api)
        disc: Any = client.DiscoveryV1Api(lab.api)
        lab.start_daemons()
        lab.wait_first_sync(n1)
        spec = {
            "type": "NodePort",
            "externalIPs": [vip, api],
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "nodePort": 30520}],
        }
        selectorless(core, disc, "web", spec, n1.pods[0])

        def answers(ip: str, port: int) -> bool:
            return bool(netns.tcp_request(ext.netns, ip, port, timeout=2)["pod"] == "pod-1-1")

        def on_dummy(ip: str) -> bool:
            out = lab_cluster.exec(n1.netns, "ip", "-o", "addr", "show", "dev", "kube-ipvs0")
            return f" {ip}/" in out.stdout

        def ipvs() -> str:
            return lab_cluster.exec(n1.netns, "ipvsadm", "-Ln").stdout

        wait_for(lambda: answers(n1.ip, 30520), 30, "NodePort on eth0's address")
        wait_for(lambda: on_dummy(vip), 30, "externalIP bound to kube-ipvs0")
        assert not on_dummy(api) and f"{api}:80" not in ipvs()  # the API server's: refused
        assert f"{added}:30520" not in ipvs()
        for ip in (added, vip):
            lab_cluster.exec(n1.netns, "ip", "addr", "add", f"{ip}/24", "dev", "eth0")
        lab_cluster.exec(n1.netns, "ip", "addr", "add", f"{LINK_LOCAL}/32", "dev", "eth0")
        lab_cluster.exec(ext.netns, "ip", "route", "replace", f"{LINK_LOCAL}/32", "via", n1.ip)
        wait_for(lambda: answers(added, 30520), 30, "NodePort on the added address")
        wait_for(lambda: answers(LINK_LOCAL, 30520), 30, "NodePort on a link-local address")
        wait_for(lambda: not on_dummy(vip), 30, "externalIP now local: not on kube-ipvs0")
        wait_for(lambda: f"{vip}:80" not in ipvs(), 30, "externalIP now the node's: refused")
        for ip in (added, vip):
            lab_cluster.exec(n1.netns, "ip", "addr", "del", f"{ip}/24", "dev", "eth0")
        wait_for(lambda: f"{added}:30520" not in ipvs(), 30, "NodePort virtual server removed")
        wait_for(lambda: on_dummy(vip), 30, "externalIP bound to kube-ipvs0 again")
        assert f"{vip}:80" in ipvs()
        wait_for(lambda: answers(n1.ip, 30520), 30, "NodePort on eth0's address still")
    finally:
        for ip in (added, vip):
            lab_cluster.exec(n1.netns, "ip", "addr", "del", f"{ip}/24", "dev", "eth0", check=False)
        lab_cluster.exec(
            n1.netns, "ip", "addr", "del", f"{LINK_LOCAL}/32", "dev", "eth0", check=False
        )
        lab_cluster.exec(ext.netns, "ip", "route", "del", f"{LINK_LOCAL}/32", check=False)
        print(lab.logs())
        lab.stop(cleanup=True)


def test_node_cidr_waits_for_the_pod_cidr_and_detects_local_traffic_by_it(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    """detectLocalMode NodeCIDR: no sync before the Node has a pod CIDR (upstream waits for
    it), then traffic to cluster IPs from outside the node's pod CIDR is masqueraded."""
    from kubernetes import client

    from lab.cluster.kube import healthz, last_sync_time

    lab = LabKube(
        lab_cluster,
        tmp_path,
        daemon_flags=("--watch-timeout", "3s", "--detect-local-mode", "NodeCIDR"),
        register_nodes=False,
    )
    lab.start_apiserver()
    lab.start_controller()
    n1 = lab_cluster.nodes[0]
    try:
        core: Any = client.CoreV1Api(lab.api)
        disc: Any = client.DiscoveryV1Api(lab.api)
        lab.start_daemons()
        # The servers start first; no sync can run without the pod CIDR.
        wait_for(lambda: last_sync_time(n1) == 0, 60, "metrics serving, no sync yet")
        assert healthz(n1)[0] == 200  # healthy while starting, as upstream
        for node in lab_cluster.nodes:
            body = node_object(node)
            body["spec"] = {"podCIDR": node.pod_cidr, "podCIDRs": [node.pod_cidr]}
            core.create_node(body)
        lab.wait_first_sync(n1)
        svc = selectorless(
            core,
            disc,
            "web",
            {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
            n1.pods[0],
        )
        vip = svc.spec.cluster_ip
        wait_for(
            lambda: netns.tcp_request(n1.pods[1].netns, vip, 80, timeout=2)["pod"] == "pod-1-1",
            30,
            "ClusterIP",
        )
        # A local pod keeps its address; the rule masquerades what is not from this node's pods.
        answer = netns.tcp_request(n1.pods[1].netns, vip, 80, timeout=2)
        assert answer["client"].split(":")[0] == n1.pods[1].ip, answer
        rules = lab_cluster.exec(n1.netns, "iptables-save", "-t", "nat").stdout
        masq = [
            ln for ln in rules.splitlines() if "KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ" in ln
        ]
        assert masq and all(f"! -s {n1.pod_cidr} " in ln for ln in masq), rules
    finally:
        print(lab.logs())
        lab.stop(cleanup=True)
