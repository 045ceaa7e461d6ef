"""Stale UDP conntrack entries are deleted over netlink, and only the matching ones."""

from __future__ import annotations

import pytest

from ipvsproxy.backends.conntrack import Conntrack
from ipvsproxy.model import DestKey, Protocol, ServiceKey
from lab import netns
from lab.topology import Cluster, Node, Pod

pytestmark = pytest.mark.kernel


def flows(cluster: Cluster, ns: str) -> str:
    return cluster.exec(ns, "conntrack", "-L", "-p", "udp").stdout


def test_forget_deletes_the_flows_a_gone_backend_answered(lab_cluster: Cluster) -> None:
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
    with netns.entered(n1.netns):
        ct = Conntrack()
        try:
            gone = ct.forget(ServiceKey(b.ip, Protocol.UDP, 8080), DestKey(b.ip, 8080))
            # A different reply source: nothing matches, nothing goes.
            none = ct.forget(ServiceKey(b.ip, Protocol.UDP, 8080), DestKey(a.ip, 8080))
        finally:
            ct.close()
    assert gone == 1 and none == 0
    after = flows(lab_cluster, n1.netns)
    assert f"dst={b.ip}" not in after
    assert f"dst={lab_cluster.node('node-3').pods[0].ip}" in after
