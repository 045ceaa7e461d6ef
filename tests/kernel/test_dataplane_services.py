"""Service semantics through the real dataplane, with real traffic from pods and from outside."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lab.net import netns
from lab.net.node_dataplane import NodeDataplane, node_dataplane, sh
from lab.net.topology import Cluster, Pod
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

pytestmark = pytest.mark.kernel


def client_ip(answer: dict[str, Any]) -> str:
    return str(answer["client"].rsplit(":", 1)[0])


def program(ndp: NodeDataplane, *services: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    def apply(dp: Any) -> None:
        for svc, slices in services:
            ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
            dp.update_service(f"{ns}/{name}", svc, slices)
        result = dp.sync()
        assert result.errors == []

    ndp.run(apply)


@pytest.fixture
def routes_to_node1(lab_cluster: Cluster) -> Iterator[None]:
    """The external client reaches load-balancer and external IPs through node-1, as a
    provider's load balancer or a router would send them."""
    ext, n1 = lab_cluster.external.netns, lab_cluster.node("node-1").ip
    for net in ("203.0.113.0/24", "198.51.100.0/24"):
        sh(lab_cluster, ext, f"ip route add {net} via {n1}")
    yield
    for net in ("203.0.113.0/24", "198.51.100.0/24"):
        sh(lab_cluster, ext, f"ip route del {net}", check=False)


def np_service(name: str, ip: str, node_port: int, **spec: Any) -> dict[str, Any]:
    port = {"name": "http", "port": 80, "nodePort": node_port, "protocol": "TCP"}
    return service(name, ip, ports=[port], type=spec.pop("type", "NodePort"), **spec)


def test_node_port_from_outside_is_masqueraded(lab_cluster: Cluster, tmp_path: Path) -> None:
    n1 = lab_cluster.node("node-1")
    backends = [n1.pods[0], lab_cluster.node("node-2").pods[0]]
    sl = endpoint_slice("np", [endpoint(p.ip, p.node) for p in backends])
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        program(ndp, (np_service("np", "10.96.1.1", 30080), [sl]))
        answers = [netns.tcp_request("external", n1.ip, 30080) for _ in range(4)]
        assert {a["pod"] for a in answers} == {"pod-1-1", "pod-2-1"}
        seen = {a["pod"]: client_ip(a) for a in answers}
        # SNAT to node-1's address towards each backend (cni0 locally, eth0 to node-2).
        assert seen == {"pod-1-1": n1.gateway, "pod-2-1": n1.ip}


# Other owners' sets of every type ipvsproxy does not use, with members: Calico's masquerade
# pools (hash:net), and the rest.
FOREIGN_SETS = {
    "cali40masq-ipam-pools": ("hash:net", "", ["10.244.0.0/16", "192.168.0.0/16"]),
    "foreign-net-iface": ("hash:net,iface", "", ["10.0.0.0/8,eth0"]),
    "foreign-mac": ("hash:mac", "", ["00:11:22:33:44:55"]),
    "foreign-bitmap-ip": ("bitmap:ip", "range 10.1.0.0/24", ["10.1.0.5"]),
    "foreign-list": ("list:set", "", ["cali40masq-ipam-pools"]),
}


def foreign_sets(cluster: Cluster, ns: str) -> dict[str, str]:
    """Each foreign set's ``ipset save`` lines (its members), by name."""
    saved = sh(cluster, ns, "ipset save")
    return {
        name: "\n".join(ln for ln in saved.splitlines() if f" {name} " in f"{ln} ")
        for name in FOREIGN_SETS
    }


def test_foreign_ipsets_of_other_types_do_not_stop_programming(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    """Sets ipvsproxy cannot decode beside its own: the ipsets are read, the rules written,
    NodePort traffic masqueraded, ``status --all`` reports ipvsproxy's sets, and cleanup leaves
    the foreign sets and their members as they were."""
    n1 = lab_cluster.node("node-1")
    for name, (kind, params, members) in FOREIGN_SETS.items():
        sh(lab_cluster, n1.netns, f"ipset create {name} {kind} {params}")
        for member in members:
            sh(lab_cluster, n1.netns, f"ipset add {name} {member}")
    before = foreign_sets(lab_cluster, n1.netns)
    try:
        backends = [n1.pods[0], lab_cluster.node("node-2").pods[0]]
        sl = endpoint_slice("np", [endpoint(p.ip, p.node) for p in backends])
        with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
            program(ndp, (np_service("np", "10.96.1.9", 30089), [sl]))
            assert ndp.run(lambda dp: dp.reconcile()).errors == []
            answers = [netns.tcp_request("external", n1.ip, 30089) for _ in range(4)]
            seen = {a["pod"]: client_ip(a) for a in answers}
            assert seen == {"pod-1-1": n1.gateway, "pod-2-1": n1.ip}
            proc = lab_cluster.exec(
                n1.netns,
                sys.executable,
                "-m",
                "ipvsproxy",
                "status",
                "--state-file",
                str(tmp_path / "s.json"),
                "--all",
                "-o",
                "json",
                check=False,
            )
            assert proc.returncode == 0, proc.stderr
            part = json.loads(proc.stdout)["all"]["ipsets"]
            assert part["error"] is None, part  # (no daemon here: no drift to compare)
            sets = {e["name"]: e["members"] for e in part["sets"]}
            assert sets["KUBE-CLUSTER-IP"] == 1 and sets["KUBE-NODE-PORT-TCP"] == 1, sets
            assert not set(FOREIGN_SETS) & set(sets)
        assert foreign_sets(lab_cluster, n1.netns) == before  # cleanup left them
    finally:
        for name in reversed(FOREIGN_SETS):  # the list:set first: it holds another
            sh(lab_cluster, n1.netns, f"ipset destroy {name}", check=False)


def test_external_traffic_policy_local(lab_cluster: Cluster, tmp_path: Path) -> None:
    n1, n2 = lab_cluster.node("node-1"), lab_cluster.node("node-2")
    svc = np_service("loc", "10.96.1.2", 30081, externalTrafficPolicy="Local")
    sl = endpoint_slice("loc", [endpoint(n1.pods[0].ip, "node-1")])
    with ExitStack() as stack:
        ndp1 = stack.enter_context(node_dataplane(lab_cluster, n1, tmp_path / "1.json"))
        ndp2 = stack.enter_context(node_dataplane(lab_cluster, n2, tmp_path / "2.json"))
        program(ndp1, (svc, [sl]))
        program(ndp2, (svc, [sl]))
        a = netns.tcp_request("external", n1.ip, 30081)
        # The local endpoint answers and sees the real client: no masquerade.
        assert (a["pod"], client_ip(a)) == ("pod-1-1", lab_cluster.external.ip)
        # node-2 has no local endpoint: external traffic is not forwarded.
        with pytest.raises(OSError):
            netns.tcp_request("external", n2.ip, 30081, timeout=2)
        # Inside the cluster the ClusterIP still reaches the endpoint from node-2's pods.
        assert netns.tcp_request(n2.pods[0].netns, "10.96.1.2", 80)["pod"] == "pod-1-1"


def test_internal_traffic_policy_local(lab_cluster: Cluster, tmp_path: Path) -> None:
    n1 = lab_cluster.node("node-1")
    eps = [endpoint(n1.pods[0].ip, "node-1"), endpoint(lab_cluster.pods[2].ip, "node-2")]
    svc = service("itp", "10.96.1.3", internalTrafficPolicy="Local")
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        program(ndp, (svc, [endpoint_slice("itp", eps)]))
        pods = {netns.tcp_request(n1.pods[1].netns, "10.96.1.3", 80)["pod"] for _ in range(4)}
        assert pods == {"pod-1-1"}


def test_load_balancer_ingress_and_source_ranges(
    lab_cluster: Cluster, tmp_path: Path, routes_to_node1: None
) -> None:
    n1 = lab_cluster.node("node-1")
    sl = endpoint_slice("lb", [endpoint(n1.pods[0].ip, "node-1")])

    def lb(ranges: list[str]) -> dict[str, Any]:
        return np_service(
            "lb",
            "10.96.1.4",
            30082,
            type="LoadBalancer",
            loadBalancerSourceRanges=ranges,
            status={
                "loadBalancer": {
                    "ingress": [{"ip": "203.0.113.10"}, {"ip": "203.0.113.11", "ipMode": "Proxy"}]
                }
            },
        )

    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        program(ndp, (lb([]), [sl]))
        assert netns.tcp_request("external", "203.0.113.10", 80)["pod"] == "pod-1-1"
        # ipMode Proxy: the load balancer proxies; the node neither binds nor programs it.
        assert "203.0.113.11" not in sh(lab_cluster, n1.netns, "ip addr show kube-ipvs0")
        program(ndp, (lb([f"{lab_cluster.external.ip}/32"]), [sl]))
        assert netns.tcp_request("external", "203.0.113.10", 80)["pod"] == "pod-1-1"
        program(ndp, (lb(["10.0.0.0/8"]), [sl]))
        with pytest.raises(OSError):  # dropped, not refused
            netns.tcp_request("external", "203.0.113.10", 80, timeout=2)


def test_external_ips(lab_cluster: Cluster, tmp_path: Path, routes_to_node1: None) -> None:
    n1 = lab_cluster.node("node-1")
    svc = service("ext", "10.96.1.5", externalIPs=["198.51.100.7"])
    sl = endpoint_slice("ext", [endpoint(lab_cluster.node("node-2").pods[0].ip, "node-2")])
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        program(ndp, (svc, [sl]))
        a = netns.tcp_request("external", "198.51.100.7", 80)
        assert (a["pod"], client_ip(a)) == ("pod-2-1", n1.ip)  # masqueraded towards node-2


@contextmanager
def kernel_without(module: str, tmp_path: Path) -> Iterator[None]:
    """The guest's kernel without ``module``: unloaded, and its loading on demand refused (the
    kernel's modprobe helper, /proc/sys/kernel/modprobe, which iptables-legacy runs too, is
    wrapped by one that refuses every name with the module's, aliases such as ipt_physdev
    for xt_physdev included); both undone after, and the module loads again on demand."""
    helper = Path("/proc/sys/kernel/modprobe")
    before = helper.read_text().strip()
    wrapper = tmp_path / "modprobe-without"
    name = module.removeprefix("xt_")
    wrapper.write_text(f'#!/bin/sh\ncase "$*" in *{name}*) exit 1;; esac\nexec {before} "$@"\n')
    wrapper.chmod(0o755)
    helper.write_text(str(wrapper))
    try:
        gone = subprocess.run(["rmmod", module], capture_output=True, text=True)
        loaded = Path(f"/sys/module/{module}").exists()
        assert not loaded, f"cannot unload {module}: {gone.stderr.strip()}"
        yield
    finally:
        helper.write_text(before)


def test_a_match_the_kernel_lacks_fails_only_its_service(
    lab_cluster: Cluster, tmp_path: Path, routes_to_node1: None
) -> None:
    """Issue 28, item 4: without xt_physdev (the externalIPs' rules use -m physdev) the
    kernel refuses the externalIPs Service's rules; the others are written and a NodePort
    still serves real traffic, masqueraded; the externalIPs Service fails alone, and serves
    once the kernel has the module again."""
    n1, n2 = lab_cluster.node("node-1"), lab_cluster.node("node-2")
    np = np_service("np", "10.96.1.40", 30090)
    np_sl = endpoint_slice("np", [endpoint(n2.pods[0].ip, "node-2")])
    ext = service("ext", "10.96.1.41", externalIPs=["198.51.100.41"])
    ext_sl = endpoint_slice("ext", [endpoint(n2.pods[0].ip, "node-2")])

    def sync_both(dp: Any) -> Any:
        dp.update_service("default/np", np, [np_sl])
        dp.update_service("default/ext", ext, [ext_sl])
        return dp.sync()

    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        with kernel_without("xt_physdev", tmp_path):
            result = ndp.run(sync_both)
            assert result.complete and result.errors == [], result.errors
            assert set(result.failed) == {"default/ext"}, result.failed
            assert "physdev" not in sh(lab_cluster, n1.netns, "iptables-save -t nat")
            a = netns.tcp_request("external", n1.ip, 30090)
            assert (a["pod"], client_ip(a)) == ("pod-2-1", n1.ip)  # masqueraded to node-2
        # The module can load again: the failed Service's retry writes its rules.
        deadline = time.monotonic() + 30
        while ndp.run(lambda dp: dp.failed) and time.monotonic() < deadline:
            time.sleep(0.2)
            ndp.run(lambda dp: dp.sync())
        assert ndp.run(lambda dp: dp.failed) == {}
        a = netns.tcp_request("external", "198.51.100.41", 80)
        assert (a["pod"], client_ip(a)) == ("pod-2-1", n1.ip)


def test_session_affinity_client_ip(lab_cluster: Cluster, tmp_path: Path) -> None:
    n1 = lab_cluster.node("node-1")
    sl = endpoint_slice("st", [endpoint(p.ip, p.node) for p in lab_cluster.pods[:4]])
    svc = service("st", "10.96.1.6", sessionAffinity="ClientIP")
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        program(ndp, (svc, [sl]))
        pods = {netns.tcp_request(n1.pods[1].netns, "10.96.1.6", 80)["pod"] for _ in range(6)}
        assert len(pods) == 1
        assert "persistent 10800" in sh(lab_cluster, n1.netns, "ipvsadm -Ln -t 10.96.1.6:80")


def test_terminating_endpoints_take_over_when_none_is_ready(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    n1 = lab_cluster.node("node-1")
    a, b = lab_cluster.pods[0], lab_cluster.pods[2]
    svc = service("term", "10.96.1.7")
    draining = endpoint(a.ip, a.node, ready=False, serving=True, terminating=True)
    gone = endpoint(b.ip, b.node, ready=False, serving=False, terminating=True)
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        program(ndp, (svc, [endpoint_slice("term", [draining, gone])]))
        pods = {netns.tcp_request(n1.pods[1].netns, "10.96.1.7", 80)["pod"] for _ in range(4)}
        assert pods == {a.name}


def test_hairpin_pod_reaches_itself_through_its_service(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    n1 = lab_cluster.node("node-1")
    pod = n1.pods[0]
    svc = service("self", "10.96.1.8")
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        program(ndp, (svc, [endpoint_slice("self", [endpoint(pod.ip, "node-1")])]))
        a = netns.tcp_request(pod.netns, "10.96.1.8", 80)
        # KUBE-LOOP-BACK masquerades the hairpin flow to the node's bridge address.
        assert (a["pod"], client_ip(a)) == (pod.name, n1.gateway)


@dataclass
class OpenSession:
    """A Service of two endpoints (one on node-1, one on node-2) programmed on node-1, and a
    TCP session from a pod of node-1 to it: ``leaving`` is the endpoint that answers it."""

    ndp: NodeDataplane
    session: netns.TCPSession
    client: Pod
    svc: dict[str, Any]
    both: dict[str, Any]  # the slice with both endpoints
    only: dict[str, Any]  # the slice without ``leaving``
    leaving: Pod
    staying: Pod


def weights(table: str) -> dict[str, int]:
    """Each real server's weight from ``ipvsadm -Ln`` (``-> ADDRESS:PORT FORWARD WEIGHT
    ACTIVECONN INACTCONN``)."""
    out = {}
    for line in table.splitlines():
        fields = line.split()
        if fields[:1] == ["->"] and fields[1][0].isdigit():
            out[fields[1]] = int(fields[3])
    return out


@contextmanager
def open_session(
    lab_cluster: Cluster, tmp_path: Path, name: str, vip: str
) -> Iterator[OpenSession]:
    n1 = lab_cluster.node("node-1")
    a, b = n1.pods[0], lab_cluster.node("node-2").pods[0]
    client = n1.pods[1]
    svc = service(name, vip)
    both = endpoint_slice(name, [endpoint(a.ip, a.node), endpoint(b.ip, b.node)])
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        program(ndp, (svc, [both]))
        with netns.TCPSession(client.netns, vip, 80) as session:
            first = session.ask()["pod"]
            leaving, staying = (a, b) if first == a.name else (b, a)
            only = endpoint_slice(name, [endpoint(staying.ip, staying.node)])
            yield OpenSession(ndp, session, client, svc, both, only, leaving, staying)


def test_graceful_termination_keeps_established_connections(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    n1 = lab_cluster.node("node-1")
    with open_session(lab_cluster, tmp_path, "gt", "10.96.1.9") as o:
        program(o.ndp, (o.svc, [o.only]))
        table = sh(lab_cluster, n1.netns, "ipvsadm -Ln -t 10.96.1.9:80")
        assert f"{o.leaving.ip}:8080" in table  # still there, at weight 0
        # The established connection goes on with its backend; new ones go elsewhere.
        assert o.session.ask()["pod"] == o.leaving.name
        fresh = {netns.tcp_request(o.client.netns, "10.96.1.9", 80)["pod"] for _ in range(4)}
        assert fresh == {o.staying.name}
        assert weights(table) == {f"{o.leaving.ip}:8080": 0, f"{o.staying.ip}:8080": 1}
        # The endpoint comes back: restored to weight 1.
        program(o.ndp, (o.svc, [o.both]))
        table = sh(lab_cluster, n1.netns, "ipvsadm -Ln -t 10.96.1.9:80")
        assert weights(table) == {f"{o.leaving.ip}:8080": 1, f"{o.staying.ip}:8080": 1}, table
        program(o.ndp, (o.svc, [o.only]))
        o.session.close()
        # Past the grace period the draining real server is deleted even with connections
        # left in TIME_WAIT.
        o.ndp.dp.clock = lambda: 10**12
        result = o.ndp.run(lambda dp: dp.sync())
        assert result.errors == []
        table = sh(lab_cluster, n1.netns, "ipvsadm -Ln -t 10.96.1.9:80")
        assert f"{o.leaving.ip}:8080" not in table


def test_a_full_sync_adopts_the_kernel_and_a_later_removal_still_drains(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    """A periodic full sync holds the real servers it read back as the desired objects, without
    their connection counts; removing one afterwards must still read the kernel's counts and
    drain it at weight 0 while a connection is open, not delete it."""
    n1 = lab_cluster.node("node-1")
    with open_session(lab_cluster, tmp_path, "adopt", "10.96.1.12") as o:
        full = o.ndp.run(lambda dp: dp.reconcile())
        assert full.full and full.errors == [] and full.writes == 0
        dp = o.ndp.dp
        assert dp.observed is not None
        key = next(k for k in dp.desired.real_servers if k.address == "10.96.1.12")
        assert dp.observed.dests[key] is dp.desired.real_servers[key]  # adopted
        program(o.ndp, (o.svc, [o.only]))
        table = sh(lab_cluster, n1.netns, "ipvsadm -Ln -t 10.96.1.12:80")
        drained = [line for line in table.splitlines() if f"{o.leaving.ip}:8080" in line]
        assert drained and drained[0].split()[3] == "0"  # weight 0, not deleted
        assert o.session.ask()["pod"] == o.leaving.name  # the open connection goes on


def test_udp_clients_move_when_their_backend_goes(lab_cluster: Cluster, tmp_path: Path) -> None:
    n1 = lab_cluster.node("node-1")
    a, b = n1.pods[0], lab_cluster.node("node-2").pods[0]
    ports = [{"name": "u", "port": 53, "protocol": "UDP"}]
    slice_ports = [{"name": "u", "port": 8080, "protocol": "UDP"}]
    svc = service("udp", "10.96.1.10", ports=ports)
    both = endpoint_slice("udp", [endpoint(a.ip, a.node), endpoint(b.ip, b.node)], slice_ports)
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        program(ndp, (svc, [both]))

        def ask() -> dict[str, Any]:
            return netns.udp_request(n1.pods[1].netns, "10.96.1.10", 53, source_port=40053)

        first = ask()["pod"]
        assert ask()["pod"] == first  # the same flow sticks to its backend
        leaving, staying = (a, b) if first == a.name else (b, a)
        program(
            ndp, (svc, [endpoint_slice("udp", [endpoint(staying.ip, staying.node)], slice_ports)])
        )
        # The UDP real server went at once (no draining) and the flow moved.
        table = sh(lab_cluster, n1.netns, "ipvsadm -Ln -u 10.96.1.10:53")
        assert f"{leaving.ip}:8080" not in table and f"{staying.ip}:8080" in table
        assert ask()["pod"] == staying.name


def test_skipped_services_and_merged_slices(lab_cluster: Cluster, tmp_path: Path) -> None:
    n1 = lab_cluster.node("node-1")
    p = lab_cluster.pods
    eps = [endpoint(x.ip, x.node) for x in p[:3]]
    skipped = [
        service("headless", "None"),
        service("lbl", "10.96.7.2", labels={"service.kubernetes.io/headless": ""}),
        service("other", "10.96.7.3", labels={"service.kubernetes.io/service-proxy-name": "x"}),
        {
            "metadata": {"name": "ext", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "example.com"},
        },
    ]
    merged = service("merged", "10.96.7.4")
    slices = [
        endpoint_slice("merged", eps[:2], name="merged-a"),
        endpoint_slice("merged", eps[1:], name="merged-b"),  # eps[1] in both
    ]
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        program(ndp, *[(svc, [endpoint_slice(svc["metadata"]["name"], eps)]) for svc in skipped])
        program(ndp, (merged, slices))
        table = sh(lab_cluster, n1.netns, "ipvsadm -Ln")
        assert "10.96.7.2" not in table and "10.96.7.3" not in table
        assert sh(lab_cluster, n1.netns, "ipvsadm -Sn").count("-a -t 10.96.7.4:80") == 3
        pods = {netns.tcp_request(n1.pods[1].netns, "10.96.7.4", 80)["pod"] for _ in range(6)}
        assert pods == {x.name for x in p[:3]}


def test_sctp_real_servers_go_at_once_as_upstream(lab_cluster: Cluster, tmp_path: Path) -> None:
    """Upstream deletes UDP and SCTP real servers at once (no graceful termination), even with
    associations open: only TCP drains at weight 0."""
    n1 = lab_cluster.node("node-1")
    a, b = n1.pods[0], lab_cluster.node("node-2").pods[0]
    ports = [{"name": "s", "port": 9000, "protocol": "SCTP"}]
    slice_ports = [{"name": "s", "port": 8080, "protocol": "SCTP"}]
    svc = service("sctp-gt", "10.96.1.14", ports=ports)
    both = endpoint_slice("sctp-gt", [endpoint(a.ip, a.node), endpoint(b.ip, b.node)], slice_ports)
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        program(ndp, (svc, [both]))
        proto = socket.IPPROTO_SCTP
        with netns.TCPSession(n1.pods[1].netns, "10.96.1.14", 9000, proto=proto) as session:
            first = session.ask()
            assert first["proto"] == "sctp"
            leaving, staying = (a, b) if first["pod"] == a.name else (b, a)
            table = sh(lab_cluster, n1.netns, "ipvsadm -Ln --sctp-service 10.96.1.14:9000")
            assert f"{leaving.ip}:8080" in table.split("ActiveConn")[1]
            only = endpoint_slice("sctp-gt", [endpoint(staying.ip, staying.node)], slice_ports)
            program(ndp, (svc, [only]))
            # Gone at once, its association open or not; new associations go to the other.
            table = sh(lab_cluster, n1.netns, "ipvsadm -Ln --sctp-service 10.96.1.14:9000")
            assert f"{leaving.ip}:8080" not in table and f"{staying.ip}:8080" in table
            assert ndp.dp.state.draining_since == {}
            fresh = {netns.sctp_request(n1.pods[1].netns, "10.96.1.14", 9000)["pod"]}
            assert fresh == {staying.name}


def test_udp_flows_refused_while_there_was_no_endpoint_work_once_there_is(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    """As upstream's CleanStaleEntries: once a UDP Service has endpoints, its conntrack
    entries not answered by one are flushed. An external client's flow to the NodePort, refused
    by the node before the Service existed, then dropped while it had no endpoint, keeps its
    source port; its stale entry would skip the masquerade (nat rules see only a flow's first
    packet), so the remote endpoint's answer would never come back through node-1."""
    n1 = lab_cluster.node("node-1")
    remote = lab_cluster.node("node-2").pods[0]
    ports = [{"name": "u", "port": 53, "nodePort": 30553, "protocol": "UDP"}]
    slice_ports = [{"name": "u", "port": 8080, "protocol": "UDP"}]
    svc = service("udp-none", "10.96.1.15", type="NodePort", ports=ports)

    def ask() -> dict[str, Any]:
        return netns.udp_request("external", n1.ip, 30553, source_port=40553, timeout=2.0)

    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        program(ndp, (service("other", "10.96.1.17"), []))  # the node's rules are in place
        with pytest.raises(OSError):  # no Service yet: the node refuses it
            ask()
        entries = sh(lab_cluster, n1.netns, "conntrack -L -p udp --dport 30553")
        assert "sport=40553" in entries  # the refused flow is tracked
        program(ndp, (svc, [endpoint_slice("udp-none", [], slice_ports)]))
        with pytest.raises(OSError):  # no endpoint: dropped
            ask()
        ready = endpoint_slice("udp-none", [endpoint(remote.ip, remote.node)], slice_ports)
        program(ndp, (svc, [ready]))
        answer = ask()  # the same flow (same source port) now reaches the endpoint
        assert answer["pod"] == remote.name and client_ip(answer) == n1.ip


def test_udp_flows_of_an_endpoint_that_went_are_flushed_and_no_others(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    """As upstream: the entries to the Service not answered by a serving endpoint go, those of
    the endpoints that stay are kept."""
    n1 = lab_cluster.node("node-1")
    a, b = n1.pods[0], lab_cluster.node("node-2").pods[0]
    ports = [{"name": "u", "port": 53, "protocol": "UDP"}]
    slice_ports = [{"name": "u", "port": 8080, "protocol": "UDP"}]
    svc = service("udp-two", "10.96.1.16", ports=ports)
    both = endpoint_slice("udp-two", [endpoint(a.ip, a.node), endpoint(b.ip, b.node)], slice_ports)
    client = n1.pods[1].netns
    with node_dataplane(lab_cluster, n1, tmp_path / "s.json") as ndp:
        program(ndp, (svc, [both]))
        answered = {}
        for sport in range(41000, 41012):  # flows to both endpoints (rr)
            answered[sport] = netns.udp_request(client, "10.96.1.16", 53, source_port=sport)["pod"]
        assert set(answered.values()) == {a.name, b.name}
        program(ndp, (svc, [endpoint_slice("udp-two", [endpoint(b.ip, b.node)], slice_ports)]))
        entries = sh(lab_cluster, n1.netns, "conntrack -L -p udp --orig-dst 10.96.1.16")
        kept = {int(p) for p in re.findall(r"sport=(\d+) dport=53 ", entries)}
        assert kept == {s for s, pod in answered.items() if pod == b.name}
