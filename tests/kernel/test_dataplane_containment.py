"""One Service's failure stays with that Service, in the real kernel with real traffic
(issue 13 A1, A3): whatever its objects or operations raise, or the kernel refuses, the other
Services are programmed and served, at the usual pace."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.dataplane.dataplane import Dataplane
from lab.net import netns
from lab.net.node_dataplane import node_dataplane, sh
from lab.net.topology import Cluster
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

pytestmark = pytest.mark.kernel


def reported(dp: Dataplane, service: str) -> bool:
    """Reported as invalid (the planner refused it) or failed (its programming failed)."""
    return service in dp.errors or service in dp.failed


def test_a_port_out_of_range_and_a_conntrack_failure_stay_with_their_service(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    from pyroute2.netlink.exceptions import NetlinkError

    node = lab_cluster.node("node-1")
    client = node.pods[1]
    pod = node.pods[0]
    # An EndpointSlice port the API server would refuse, but a slice is what it is.
    bad = service("bad", "10.96.7.1")
    bad_sl = endpoint_slice(
        "bad", [endpoint(pod.ip)], ports=[{"name": "http", "port": 70000, "protocol": "TCP"}]
    )
    good = service("good", "10.96.7.2")
    good_sl = endpoint_slice("good", [endpoint(pod.ip)])
    with node_dataplane(lab_cluster, node, tmp_path / "state.json") as ndp:

        def first(dp: Dataplane) -> Any:
            dp.update_service("default/bad", bad, [bad_sl])
            dp.update_service("default/good", good, [good_sl])
            return dp.sync()

        ndp.run(first)
        assert ndp.run(lambda dp: reported(dp, "default/bad"))
        assert netns.tcp_request(client.netns, "10.96.7.2", 80)["pod"] == pod.name
        # A UDP Service whose conntrack cleanup fails (pyroute2 raises NetlinkError) when one
        # of its real servers goes; a new Service arrives in the same sync.
        udp = [{"name": "d", "port": 53, "protocol": "UDP"}]
        dns = service("dns", "10.96.7.53", ports=udp)
        eps = [endpoint(p.ip, p.node) for p in lab_cluster.pods[:2]]
        slice_ports = [{"name": "d", "port": 8080, "protocol": "UDP"}]
        ndp.run(
            lambda dp: (
                dp.update_service("default/dns", dns, [endpoint_slice("dns", eps, slice_ports)]),
                dp.sync(),
            )
        )
        assert netns.udp_request(client.netns, "10.96.7.53", 53)["pod"] in {
            p.name for p in lab_cluster.pods[:2]
        }

        def refuse(*_args: Any) -> int:
            raise NetlinkError(22, "Invalid argument")

        ndp.dp.backends.conntrack.flush_stale = refuse  # type: ignore[method-assign,assignment]
        later = service("later", "10.96.7.3")
        later_sl = endpoint_slice("later", [endpoint(lab_cluster.pods[2].ip, "node-2")])

        def second(dp: Dataplane) -> Any:
            dp.update_service("default/dns", dns, [endpoint_slice("dns", eps[:1], slice_ports)])
            dp.update_service("default/later", later, [later_sl])
            return dp.sync()

        result = ndp.run(second)
        assert "default/dns" in result.failed and "conntrack" in result.failed["default/dns"]
        assert set(result.failed) == {"default/dns"}
        # The kernel holds every other change of that sync, and serves it.
        assert netns.tcp_request(client.netns, "10.96.7.3", 80)["pod"] == lab_cluster.pods[2].name
        ipvs = sh(lab_cluster, node.netns, "ipvsadm -Ln")
        assert lab_cluster.pods[1].ip not in ipvs.split("10.96.7.53:53")[1].split("TCP")[0]
        assert netns.tcp_request(client.netns, "10.96.7.2", 80)["pod"] == pod.name


def test_a_refused_service_is_retried_on_its_own_and_others_program_at_once(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    """The kernel refuses one Service's virtual server every time (its scheduler does not
    exist); a Service created meanwhile is programmed by the next incremental sync, no full
    reconcile needed, and answers; the refused one is retried on its own 1 s, 2 s, ... backoff."""
    import dataclasses

    node = lab_cluster.node("node-1")
    client = node.pods[1]
    now = [1000.0]
    with node_dataplane(lab_cluster, node, tmp_path / "state.json") as ndp:
        ndp.dp.failures.clock = lambda: now[0]
        enc = ndp.backends.ipvs.encoder
        new_service = enc.new_service

        def refused_scheduler(seq: int, vs: Any) -> bytes:
            if vs.key.address == "10.96.9.1":
                vs = dataclasses.replace(vs, scheduler="nosuch")
            return new_service(seq, vs)

        enc.new_service = refused_scheduler  # type: ignore[method-assign]
        stuck = service("stuck", "10.96.9.1")
        eps = [endpoint(lab_cluster.pods[0].ip)]

        def first(dp: Dataplane) -> Any:
            dp.update_service("default/stuck", stuck, [endpoint_slice("stuck", eps)])
            return dp.sync()

        result = ndp.run(first)
        assert set(result.failed) == {"default/stuck"}
        assert "10.96.9.1:80" in result.failed["default/stuck"]
        refused = ndp.dp.backends.ipvs.counters.failed.get("add_service", 0)
        assert refused >= 1
        # A new Service: the next incremental sync programs it.
        later = service("later", "10.96.9.2")
        later_sl = endpoint_slice("later", [endpoint(lab_cluster.pods[2].ip, "node-2")])

        def second(dp: Dataplane) -> Any:
            dp.update_service("default/later", later, [later_sl])
            return dp.sync()

        result = ndp.run(second)
        assert not result.full and result.failed == {}
        assert netns.tcp_request(client.netns, "10.96.9.2", 80)["pod"] == lab_cluster.pods[2].name
        # Its retry was not due yet: the kernel was not asked again.
        assert ndp.dp.backends.ipvs.counters.failed.get("add_service", 0) == refused
        assert ndp.dp.failed["default/stuck"].attempts == 1
        now[0] += 1.0  # its retry is due
        result = ndp.run(lambda dp: dp.sync())
        assert not result.full and set(result.failed) == {"default/stuck"}
        assert ndp.dp.backends.ipvs.counters.failed.get("add_service", 0) == refused + 1
        failure = ndp.dp.failed["default/stuck"]
        assert failure.attempts == 2 and failure.retry_at == now[0] + 2.0
        # The kernel accepts it again: the next retry programs it and clears the failure.
        enc.new_service = new_service  # type: ignore[method-assign]
        now[0] += 2.0
        result = ndp.run(lambda dp: dp.sync())
        assert not result.full and result.failed == {} and ndp.dp.failed == {}
        assert netns.tcp_request(client.netns, "10.96.9.1", 80)["pod"] == lab_cluster.pods[0].name
        assert netns.tcp_request(client.netns, "10.96.9.2", 80)["pod"] == lab_cluster.pods[2].name


def test_a_failing_iptables_save_does_not_stop_programming(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    """iptables-save fails (issue 13 A4): the first full sync still programs IPVS, binds the
    address, fills the ipsets and writes the chains; pods and the node itself (masqueraded by
    those chains) reach the Service."""
    node = lab_cluster.node("node-1")
    svc = service("web", "10.96.9.10")
    sl = endpoint_slice("web", [endpoint(lab_cluster.pods[2].ip, "node-2")])
    with node_dataplane(lab_cluster, node, tmp_path / "state.json") as ndp:
        ndp.backends.iptables.save_cmd = "false"
        result = ndp.run(lambda dp: (dp.update_service("default/web", svc, [sl]), dp.sync())[1])
        assert result.full and result.complete
        assert any("reading iptables" in e for e in result.errors), result.errors
        assert "KUBE-SERVICES" in sh(lab_cluster, node.netns, "iptables -t nat -S")
        want = lab_cluster.pods[2].name
        assert netns.tcp_request(node.pods[1].netns, "10.96.9.10", 80)["pod"] == want
        assert netns.tcp_request(node.netns, "10.96.9.10", 80)["pod"] == want
        # iptables-save works again: the next full sync finds the jumps and writes nothing.
        ndp.backends.iptables.save_cmd = "iptables-save"
        again = ndp.run(lambda dp: dp.reconcile())
        assert again.errors == []
