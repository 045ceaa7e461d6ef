"""ClusterIP Services through the real dataplane, with real traffic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lab.net import netns
from lab.net.node_dataplane import node_dataplane, sh
from lab.net.topology import Cluster
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

pytestmark = pytest.mark.kernel


def web(cluster: Cluster) -> tuple[dict[str, Any], dict[str, Any]]:
    p11, p21 = cluster.node("node-1").pods[0], cluster.node("node-2").pods[0]
    return service("web", "10.96.0.10"), endpoint_slice(
        "web", [endpoint(p11.ip, "node-1"), endpoint(p21.ip, "node-2")]
    )


def test_cluster_ip_reaches_every_backend_without_masquerade_from_pods(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    node = lab_cluster.node("node-1")
    client = node.pods[1]
    svc, sl = web(lab_cluster)
    with node_dataplane(lab_cluster, node, tmp_path / "state.json") as ndp:
        result = ndp.run(lambda dp: (dp.update_service("default/web", svc, [sl]), dp.sync())[1])
        assert result.errors == []
        assert result.full and result.writes > 0
        answers = [netns.tcp_request(client.netns, "10.96.0.10", 80) for _ in range(4)]
        assert {a["pod"] for a in answers} == {"pod-1-1", "pod-2-1"}
        # From the pod network: the backend sees the client pod itself.
        assert {a["client"].split(":")[0] for a in answers} == {client.ip}
        udp_svc = service("dns", "10.96.0.53", ports=[{"name": "d", "port": 53, "protocol": "UDP"}])
        udp_sl = endpoint_slice(
            "dns",
            [endpoint(node.pods[0].ip)],
            ports=[{"name": "d", "port": 8080, "protocol": "UDP"}],
        )
        ndp.run(lambda dp: (dp.update_service("default/dns", udp_svc, [udp_sl]), dp.sync()))
        assert netns.udp_request(client.netns, "10.96.0.53", 53)["pod"] == "pod-1-1"
        # Nothing changed: an incremental sync and a full reconcile both write nothing.
        assert ndp.run(lambda dp: dp.sync()).writes == 0
        full = ndp.run(lambda dp: dp.reconcile())
        assert (full.errors, full.writes) == ([], 0)


def test_cluster_ip_from_the_node_itself_is_masqueraded(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    node = lab_cluster.node("node-1")
    svc, sl = web(lab_cluster)
    with node_dataplane(lab_cluster, node, tmp_path / "state.json") as ndp:
        ndp.run(lambda dp: (dp.update_service("default/web", svc, [sl]), dp.sync()))
        seen = {}
        for _ in range(4):
            a = netns.tcp_request(node.netns, "10.96.0.10", 80)
            seen[a["pod"]] = a["client"].split(":")[0]
        # Not from the cluster CIDR: SNAT to the node's address on the way to each backend.
        assert seen == {"pod-1-1": node.gateway, "pod-2-1": node.ip}


def test_ipvs_filter_rejects_other_ports_on_service_addresses(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    node = lab_cluster.node("node-1")
    svc, sl = web(lab_cluster)
    with node_dataplane(lab_cluster, node, tmp_path / "state.json") as ndp:
        ndp.run(lambda dp: (dp.update_service("default/web", svc, [sl]), dp.sync()))
        # node-1 runs a hostNetwork echo on 9090: a ClusterIP must not expose it.
        with pytest.raises(ConnectionRefusedError):
            netns.tcp_request(node.pods[0].netns, "10.96.0.10", 9090, timeout=2)
        assert netns.tcp_request(node.pods[0].netns, node.ip, 9090)["pod"] == "node-1"
        rules = sh(lab_cluster, node.netns, "iptables -S KUBE-IPVS-FILTER")
        assert "--match-set KUBE-IPVS-IPS dst -j REJECT" in rules


def test_sctp_cluster_ip(lab_cluster: Cluster, tmp_path: Path) -> None:
    node = lab_cluster.node("node-1")
    svc = service("sctp", "10.96.0.12", ports=[{"name": "s", "port": 9000, "protocol": "SCTP"}])
    sl = endpoint_slice(
        "sctp",
        [endpoint(lab_cluster.node("node-2").pods[0].ip, "node-2")],
        ports=[{"name": "s", "port": 8080, "protocol": "SCTP"}],
    )
    with node_dataplane(lab_cluster, node, tmp_path / "state.json") as ndp:
        result = ndp.run(lambda dp: (dp.update_service("default/sctp", svc, [sl]), dp.sync())[1])
        assert result.errors == []
        answer = netns.sctp_request(node.pods[1].netns, "10.96.0.12", 9000)
        assert (answer["pod"], answer["proto"]) == ("pod-2-1", "sctp")


def test_masquerade_all(lab_cluster: Cluster, tmp_path: Path) -> None:
    from ipvsproxy.core.ruleset import RulesConfig

    node = lab_cluster.node("node-1")
    svc = service("m", "10.96.0.13")
    sl = endpoint_slice("m", [endpoint(lab_cluster.node("node-2").pods[0].ip, "node-2")])
    cfg = RulesConfig(masquerade_all=True, cluster_cidr="10.244.0.0/16")
    with node_dataplane(lab_cluster, node, tmp_path / "state.json", rules_config=cfg) as ndp:
        ndp.run(lambda dp: (dp.update_service("default/m", svc, [sl]), dp.sync()))
        answer = netns.tcp_request(node.pods[1].netns, "10.96.0.13", 80)
        # Even pod traffic is masqueraded: the backend sees node-1, not the client pod.
        assert answer["client"].split(":")[0] == node.ip
