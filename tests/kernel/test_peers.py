"""Upstream peers in the lab: kube-proxy (IPVS mode, configured as kubeadm does) and kube-router
(service proxy only), each in a node namespace of its own, program IPVS from the real control
plane and pass traffic (``lab/cluster/peers.py``)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.cluster import peers
from lab.cluster.kube import METRICS_ADDRESS, LabKube, http_get_from, last_sync_time, wait_for
from lab.cluster.kubelet import LabPod
from lab.net import netns
from lab.net.topology import Cluster
from tests.e2e.cluster import parse_proc_ip_vs
from tests.unit.metric_shapes import golden, shapes, upstream_names

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


# Series upstream registers in IPVS mode that appear only after a failure the lab does not
# cause (an iptables-restore refused).
ONLY_AFTER_A_FAILURE = {"kubeproxy_sync_proxy_rules_iptables_restore_failures_total"}


def test_kube_proxys_metrics_are_the_checked_in_list(
    lab_cluster: Cluster, kube: LabKube, tmp_path: Path
) -> None:
    """The real kube-proxy (IPVS mode) exposes kubeproxy_*, process_* and
    kubernetes_build_info exactly as tests/unit/golden/metrics-kube-proxy-ipvs.txt lists them
    (name, type, label names, buckets, help), which ipvsproxy's are held to on the host; and
    /proxyMode and /configz as ipvsproxy serves them."""
    n2 = lab_cluster.nodes[1]
    kp = peers.kube_proxy(
        n2.name,
        n2.netns,
        peers.grant_kube_proxy(kube.controlplane, tmp_path / "kube-proxy.kubeconfig"),
        tmp_path,
    )
    try:
        # The Service comes after kube-proxy's start: the slice's trigger time (the Service's
        # creationTimestamp, to the second) must be later for network programming latency.
        wait_for(lambda: last_sync_time(n2) > 0, 60, "kube-proxy's first sync")
        time.sleep(1.1)
        # A UDP port: its endpoints' change runs the conntrack reconciler.
        ports = [
            {"name": "http", "port": 80, "targetPort": "echo"},
            {"name": "dns", "port": 53, "targetPort": 8080, "protocol": "UDP"},
        ]
        kube.controlplane.call(
            "POST",
            "/api/v1/namespaces/default/services",
            {"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": ports}},
        )
        url = f"http://{METRICS_ADDRESS}"

        def probed() -> bool:  # a probe of each: the healthz and livez counters
            return all(
                http_get_from(n2.netns, f"http://127.0.0.1:10256{path}")[0] == 200
                for path in ("/healthz", "/livez")
            )

        wait_for(probed, 60, "kube-proxy's /healthz and /livez")
        wanted = set(golden()) - ONLY_AFTER_A_FAILURE

        def every_series() -> bool:
            return wanted <= set(shapes(http_get_from(n2.netns, f"{url}/metrics")[1]))

        with contextlib.suppress(AssertionError):  # the comparison below says what is missing
            wait_for(every_series, 120, "every series of the list")
        text = http_get_from(n2.netns, f"{url}/metrics")[1]
        found = shapes(text)
        expected = golden()
        assert set(upstream_names(found)) == wanted
        for name in wanted:
            assert found[name].key() == expected[name].key(), name
        assert found["kubeproxy_sync_proxy_rules_no_local_endpoints_total"].values == {
            "traffic_policy": {"internal", "external"},
            "ip_family": {"IPv4", "IPv6"},
        }
        print("upstream's other series:", sorted(set(found) - set(expected)))
        assert http_get_from(n2.netns, f"{url}/proxyMode") == (200, "ipvs")
        configz = json.loads(http_get_from(n2.netns, f"{url}/configz")[1])
        assert configz["kubeproxy.config.k8s.io"]["kind"] == "KubeProxyConfiguration"
        assert kp.running(), kp.logs()
    finally:
        print(kp.logs()[-3000:])
        kp.stop()
        peers.kube_proxy_cleanup(n2.netns)
