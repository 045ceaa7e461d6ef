"""Upstream peers in the lab: kube-proxy (IPVS mode, configured as kubeadm does) and kube-router
(service proxy only), each in a node namespace of its own, program IPVS from the real control
plane and pass traffic (``lab/cluster/peers.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.cluster import peers
from lab.cluster.kube import LabKube, wait_for
from lab.cluster.kubelet import LabPod
from lab.net import netns
from lab.net.topology import Cluster
from tests.e2e.cluster import parse_proc_ip_vs

pytestmark = pytest.mark.kernel


@pytest.fixture
def kube(lab_cluster: Cluster, tmp_path: Path) -> Iterator[LabKube]:
    lab = LabKube(lab_cluster, tmp_path)
    lab.start_apiserver()
    lab.start_controller(
        [
            LabPod(p.name, "default", p.node, p.ip, {"app": "web"}, {"echo": 8080})
            for p in lab_cluster.pods
        ]
    )
    try:
        yield lab
    finally:
        lab.stop(cleanup=False)


def answers(ns: str, ip: str, port: int, n: int = 12) -> set[str]:
    return {netns.tcp_request(ns, ip, port, timeout=2)["pod"] for _ in range(n)}


def test_kube_proxy_and_kube_router_program_ipvs_and_pass_traffic(
    lab_cluster: Cluster, kube: LabKube, tmp_path: Path
) -> None:
    cp = kube.controlplane
    n2, n3 = lab_cluster.nodes[1], lab_cluster.nodes[2]
    kp_config = peers.grant_kube_proxy(cp, tmp_path / "kube-proxy.kubeconfig")
    started = [
        peers.kube_proxy(n2.name, n2.netns, kp_config, tmp_path),
        peers.kube_router(n3.name, n3.netns, cp.kubeconfig, tmp_path),
    ]
    try:
        svc: Any = cp.call(
            "POST",
            "/api/v1/namespaces/default/services",
            {
                "metadata": {"name": "web"},
                "spec": {
                    "type": "NodePort",
                    "selector": {"app": "web"},
                    "ports": [{"name": "http", "port": 80, "targetPort": "echo"}],
                },
            },
        )
        vip, node_port = svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["nodePort"]
        everyone = {p.name for p in lab_cluster.pods}
        for peer, node in zip(started, (n2, n3), strict=True):

            def programmed(ns: str = node.netns) -> bool:
                table = parse_proc_ip_vs(lab_cluster.exec(ns, "cat", "/proc/net/ip_vs").stdout)
                return ("TCP", vip, 80) in table

            wait_for(programmed, 120, f"{peer.name} programs {vip}:80")
            assert peer.running(), peer.logs()

            # A pod of that node reaches every endpoint through the peer's IPVS.
            def all_answer(ns: str = node.pods[0].netns) -> bool:
                return answers(ns, vip, 80) == everyone

            wait_for(all_answer, 60, f"{peer.name}: ClusterIP answered by every pod")
        # kube-proxy's NodePort from outside the cluster.
        ext = lab_cluster.external.netns
        wait_for(lambda: answers(ext, n2.ip, node_port, 4) <= everyone, 60, "kube-proxy NodePort")
    finally:
        for peer in started:
            print(peer.logs())
            peer.stop()
        for node in (n2, n3):
            peers.kube_proxy_cleanup(node.netns)
