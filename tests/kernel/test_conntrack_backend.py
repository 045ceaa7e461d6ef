"""Stale UDP conntrack entries are deleted over netlink, and only the matching ones."""

from __future__ import annotations

import pytest

from ipvsproxy.core.virtual_servers import Protocol, ServiceKey
from ipvsproxy.kernel.conntrack import Conntrack
from lab.net import netns
from lab.net.topology import Cluster, Node, Pod

pytestmark = pytest.mark.kernel


def flows(cluster: Cluster, ns: str) -> str:
    return cluster.exec(ns, "conntrack", "-L", "-p", "udp").stdout


def test_flush_stale_deletes_the_flows_no_live_backend_answers(lab_cluster: Cluster) -> None:
    n1 = lab_cluster.node("node-1")
    client, a, b = n1.pods[1], n1.pods[0], lab_cluster.node("node-2").pods[0]
    # A conntrack match makes node-1 track forwarded flows (as ipvsproxy's rules do).
    rule = ["FORWARD", "-m", "conntrack", "--ctstate", "NEW", "-j", "ACCEPT"]
    lab_cluster.exec(n1.netns, "iptables", "-A", *rule)
    try:
        check(lab_cluster, n1, client, a, b)
    finally:
        lab_cluster.exec(n1.netns, "iptables", "-D", *rule)


def check(cluster: Cluster, n1: Node, client: Pod, a: Pod, b: Pod) -> None:
    lab_cluster = cluster
    # Two UDP flows forwarded by node-1.
    netns.udp_request(client.netns, b.ip, 8080, source_port=41000)
    netns.udp_request(client.netns, lab_cluster.node("node-3").pods[0].ip, 8080, source_port=41001)
    before = flows(lab_cluster, n1.netns)
    assert f"dst={b.ip}" in before
    key = ServiceKey(b.ip, Protocol.UDP, 8080)
    with netns.entered(n1.netns):
        ct = Conntrack()
        try:
            kept = ct.flush_stale(key, live={b.ip})  # answered by a live real server: kept
            # None live: only those answered by a removed real server go; another: nothing.
            none = ct.flush_stale(key, live=set(), gone={a.ip})
            assert flows(lab_cluster, n1.netns).count(f"dst={b.ip}") == before.count(f"dst={b.ip}")
            gone = ct.flush_stale(key, live={a.ip})  # not answered by a live one: goes
        finally:
            ct.close()
    assert kept == 0 and none == 0 and gone == 1
    after = flows(lab_cluster, n1.netns)
    assert f"dst={b.ip}" not in after
    assert f"dst={lab_cluster.node('node-3').pods[0].ip}" in after
