"""Inputs that real clusters send, through the real dataplane with real traffic: a /0 source
range, endpoint addresses the kernel refuses, externalIPs no Service may take, two Services
claiming one virtual server, and externalTrafficPolicy Local without a local endpoint."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from lab.net import netns
from lab.net.node_dataplane import NodeDataplane, node_dataplane, sh
from lab.net.topology import Cluster
from tests.kernel.test_dataplane_services import client_ip, np_service, routes_to_node1
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

pytestmark = pytest.mark.kernel
__all__ = ["routes_to_node1"]  # a fixture, used by name


def apply(ndp: NodeDataplane, *services: tuple[str, dict[str, Any] | None, list[Any]]) -> Any:
    """Update each (namespace/name, Service or None, slices) and sync; the sync's result."""

    def run(dp: Any) -> Any:
        for name, svc, slices in services:
            dp.update_service(name, svc, slices)
        return dp.sync()

    return ndp.run(run)


def real_servers(cluster: Cluster, ns: str, vip: str, port: int = 80) -> list[str]:
    table = sh(cluster, ns, f"ipvsadm -Ln -t {vip}:{port}")
    """The virtual server's serving real servers (weight 0, draining, left out)."""
    rows = [line.split() for line in table.splitlines() if line.strip().startswith("->")]
    return sorted(row[1] for row in rows if row[1] != "RemoteAddress:Port" and row[3] != "0")


def test_source_range_of_everyone_admits_everyone(
    lab_cluster: Cluster, tmp_path: Path, routes_to_node1: None
) -> None:
    """loadBalancerSourceRanges 0.0.0.0/0 (a common value): the kernel refuses a /0 in a
    hash:ip,port,net set, so a /0 must mean what it says, no filter at all (upstream #132722)."""
    n1 = lab_cluster.node("node-1")
    sl = endpoint_slice("all", [endpoint(n1.pods[0].ip, "node-1")])

    def lb(ranges: list[str]) -> dict[str, Any]:
        status = {"loadBalancer": {"ingress": [{"ip": "203.0.113.20"}]}}
        return np_service(
            "all",
            "10.96.2.1",
            30092,
            type="LoadBalancer",
            loadBalancerSourceRanges=ranges,
            status=status,
        )

    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        for ranges in (["0.0.0.0/0"], ["10.0.0.0/8", "0.0.0.0/0"], ["192.0.2.1/0"]):
            result = apply(ndp, ("default/all", lb(ranges), [sl]))
            assert result.errors == [], ranges
            a = netns.tcp_request("external", "203.0.113.20", 80, timeout=3)
            assert a["pod"] == "pod-1-1", ranges
        # A real range still filters.
        apply(ndp, ("default/all", lb(["10.0.0.0/8"]), [sl]))
        with pytest.raises(OSError):
            netns.tcp_request("external", "203.0.113.20", 80, timeout=2)


def test_endpoint_addresses_the_kernel_refuses_are_skipped_the_others_serve(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    n1 = lab_cluster.node("node-1")
    good = [n1.pods[0], lab_cluster.node("node-2").pods[0]]
    odd = ["224.0.0.5", "255.255.255.255", "0.0.0.0", "fd00::1", "010.1.1.1"]
    eps = [endpoint(p.ip, p.node) for p in good] + [endpoint(ip, "node-3") for ip in odd]
    slices = [
        endpoint_slice("odd", eps, name="odd-a"),
        # A port outside 1..65535 (the API server does not check a slice's ports).
        endpoint_slice(
            "odd",
            [endpoint(lab_cluster.node("node-3").pods[0].ip, "node-3")],
            ports=[{"name": "http", "port": 70000, "protocol": "TCP"}],
            name="odd-b",
        ),
    ]
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        result = apply(ndp, ("default/odd", service("odd", "10.96.2.2"), slices))
        assert result.errors == []
        warning = ndp.dp.errors["default/odd"]
        for what in [*odd, "70000"]:
            assert what in warning
        assert real_servers(lab_cluster, n1.netns, "10.96.2.2") == sorted(
            f"{p.ip}:8080" for p in good
        )
        answers = {netns.tcp_request(n1.pods[1].netns, "10.96.2.2", 80)["pod"] for _ in range(6)}
        assert answers == {p.name for p in good}


def test_a_loopback_external_ip_is_refused_and_the_nodes_localhost_stays_reachable(
    lab_cluster: Cluster, tmp_path: Path, routes_to_node1: None
) -> None:
    """externalIPs [127.0.0.1, the node's own IP, a valid one]: bound on kube-ipvs0, 127.0.0.1
    would make KUBE-IPVS-FILTER reject new connections to every other localhost port of the
    node (the kubelet's healthz, etcd); both are refused and reported, the valid one serves."""
    n1 = lab_cluster.node("node-1")
    listener = netns.make_socket(n1.netns, socket.SOCK_STREAM)
    listener.settimeout(3)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]

    def localhost_reachable() -> bool:
        try:
            with netns.make_socket(n1.netns, socket.SOCK_STREAM) as client:
                client.settimeout(3)
                client.connect(("127.0.0.1", port))
                listener.accept()[0].close()
            return True
        except OSError:
            return False

    svc = service("loopy", "10.96.2.6", externalIPs=["127.0.0.1", n1.ip, "198.51.100.31"])
    sl = endpoint_slice("loopy", [endpoint(n1.pods[0].ip, "node-1")])
    try:
        assert localhost_reachable()
        with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
            result = apply(ndp, ("default/loopy", svc, [sl]))
            assert result.errors == []
            assert localhost_reachable()
            a = netns.tcp_request("external", "198.51.100.31", 80)
            assert a["pod"] == n1.pods[0].name
            assert "127.0.0.1" not in sh(lab_cluster, n1.netns, "ip -4 addr show dev kube-ipvs0")
            assert f"{n1.ip}:80" not in sh(lab_cluster, n1.netns, "ipvsadm -Ln")
            warning = ndp.dp.errors["default/loopy"]
            assert "'127.0.0.1' (loopback" in warning
            assert f"'{n1.ip}' (this node's address" in warning
    finally:
        listener.close()


def _created(svc: dict[str, Any], when: str) -> dict[str, Any]:
    svc["metadata"]["creationTimestamp"] = when
    return svc


def test_the_service_that_had_an_address_first_keeps_it(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    """A newer Service's externalIPs equal to an older Service's ClusterIP (CVE-2020-8554
    class): the older one keeps its traffic whatever order they arrive in, the newer one is
    reported, and when it goes the victim's virtual server holds exactly its own endpoints."""
    n1 = lab_cluster.node("node-1")
    mine, theirs = n1.pods[0], lab_cluster.node("node-2").pods[0]
    victim = _created(service("victim", "10.96.2.3"), "2020-01-01T00:00:00Z")
    thief = _created(
        service("thief", "10.96.2.4", externalIPs=["10.96.2.3"]), "2021-01-01T00:00:00Z"
    )
    v_sl = endpoint_slice("victim", [endpoint(mine.ip, mine.node)])
    t_sl = endpoint_slice("thief", [endpoint(theirs.ip, theirs.node)])
    client = n1.pods[1].netns
    for order in ((0, 1), (1, 0)):
        updates = [("default/victim", victim, [v_sl]), ("default/thief", thief, [t_sl])]
        with node_dataplane(lab_cluster, n1, tmp_path / f"s{order[0]}.json") as ndp:
            assert apply(ndp, *[updates[i] for i in order]).errors == []
            answers = {netns.tcp_request(client, "10.96.2.3", 80)["pod"] for _ in range(4)}
            assert answers == {mine.name}, order
            assert "10.96.2.3" in ndp.dp.errors["default/thief"]
            assert "default/victim" not in ndp.dp.errors
            assert ndp.run(lambda dp: dp.reconcile()).writes == 0  # the kernel is as desired
            assert real_servers(lab_cluster, n1.netns, "10.96.2.3") == [f"{mine.ip}:8080"]
            # The thief goes: the victim's virtual server is exactly its own.
            assert apply(ndp, ("default/thief", None, [])).errors == []
            assert real_servers(lab_cluster, n1.netns, "10.96.2.3") == [f"{mine.ip}:8080"]
            assert netns.tcp_request(client, "10.96.2.3", 80)["pod"] == mine.name
            assert "default/thief" not in ndp.dp.errors
            # Back, then the victim goes: now the other one owns it, exactly.
            apply(ndp, ("default/thief", thief, [t_sl]))
            apply(ndp, ("default/victim", None, []))
            assert real_servers(lab_cluster, n1.netns, "10.96.2.3") == [f"{theirs.ip}:8080"]
            assert "default/thief" not in ndp.dp.errors
            full = ndp.run(lambda dp: dp.reconcile())
            assert (full.errors, full.writes) == ([], 0)


def test_local_policy_without_a_local_endpoint_serves_pods_and_the_node(
    lab_cluster: Cluster, tmp_path: Path, routes_to_node1: None
) -> None:
    """externalTrafficPolicy Local and no endpoint on this node: pods and the node itself reach
    the NodePort, the load-balancer IP and the external IP through the cluster's endpoints
    (upstream's short-circuit): pods with their own address, the node masqueraded; external
    clients are still not forwarded."""
    n1 = lab_cluster.node("node-1")
    remote = lab_cluster.node("node-2").pods[0]
    svc = np_service(
        "nolocal",
        "10.96.2.5",
        30093,
        type="LoadBalancer",
        externalTrafficPolicy="Local",
        externalIPs=["198.51.100.9"],
        status={"loadBalancer": {"ingress": [{"ip": "203.0.113.21"}]}},
    )
    sl = endpoint_slice("nolocal", [endpoint(remote.ip, remote.node)])
    targets = [(n1.ip, 30093), ("203.0.113.21", 80), ("198.51.100.9", 80)]
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        assert apply(ndp, ("default/nolocal", svc, [sl])).errors == []
        for host, port in targets:
            a = netns.tcp_request(n1.pods[1].netns, host, port, timeout=3)
            assert (a["pod"], client_ip(a)) == (remote.name, n1.pods[1].ip), (host, port)
            a = netns.tcp_request(n1.netns, host, port, timeout=3)
            assert (a["pod"], client_ip(a)) == (remote.name, n1.ip), (host, port)
            with pytest.raises(OSError):
                netns.tcp_request("external", host, port, timeout=2)
        # A local endpoint appears: external clients reach it, unmasqueraded.
        local = n1.pods[0]
        both = endpoint_slice(
            "nolocal", [endpoint(remote.ip, remote.node), endpoint(local.ip, local.node)]
        )
        assert apply(ndp, ("default/nolocal", svc, [both])).errors == []
        for host, port in targets:
            a = netns.tcp_request("external", host, port, timeout=3)
            assert (a["pod"], client_ip(a)) == (local.name, lab_cluster.external.ip)
