"""Stale UDP conntrack entries are deleted over netlink, and only the matching ones."""

from __future__ import annotations

import pytest

from ipvsproxy.core.virtual_servers import Protocol, ServiceKey
from ipvsproxy.kernel.conntrack import Conntrack, Stale
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
    other = lab_cluster.node("node-3").pods[0].ip
    key3 = ServiceKey(other, Protocol.UDP, 8080)
    with netns.entered(n1.netns):
        ct = Conntrack()
        try:
            # Answered by a live real server: kept; none live: only those answered by a
            # removed real server go, another's stay. Two targets: one read of the table.
            kept = ct.flush_stale({key: Stale({b.ip}), key3: Stale(set(), {a.ip})})
            assert flows(lab_cluster, n1.netns).count(f"dst={b.ip}") == before.count(f"dst={b.ip}")
            # One target (filtered in the kernel): not answered by a live one, it goes.
            gone = ct.flush_stale({key: Stale({a.ip})})
        finally:
            ct.close()
    assert kept == {key: 0, key3: 0} and gone == {key: 1}
    after = flows(lab_cluster, n1.netns)
    assert f"dst={b.ip}" not in after
    assert f"dst={other}" in after
    assert ct.counters.ok == {"delete_conntrack": 1}


def test_flush_stale_cleans_many_virtual_servers_from_one_read(lab_cluster: Cluster) -> None:
    """Several targets: each one's stale entries go, whatever else the table holds."""
    n1 = lab_cluster.node("node-1")
    client = n1.pods[1]
    targets = [lab_cluster.node(n).pods[0] for n in ("node-2", "node-3")] + [n1.pods[0]]
    rule = ["FORWARD", "-m", "conntrack", "--ctstate", "NEW", "-j", "ACCEPT"]
    lab_cluster.exec(n1.netns, "iptables", "-A", *rule)
    try:
        for i, pod in enumerate(targets):
            netns.udp_request(client.netns, pod.ip, 8080, source_port=42000 + i)
    finally:
        lab_cluster.exec(n1.netns, "iptables", "-D", *rule)
    keys = [ServiceKey(p.ip, Protocol.UDP, 8080) for p in targets]
    table = flows(lab_cluster, n1.netns)  # with the tests' before: the cluster is shared
    to = [table.count(f"dst={p.ip} sport=") for p in targets]  # original tuples only
    assert min(to) >= 1, table
    with netns.entered(n1.netns):
        ct = Conntrack()
        try:
            # The first two: answered by no live one (stale); the third: its live one answers.
            out = ct.flush_stale(
                {keys[0]: Stale({"10.244.9.9"}), keys[1]: Stale({"10.244.9.9"}),
                 keys[2]: Stale({targets[2].ip})}
            )  # fmt: skip
        finally:
            ct.close()
    left = flows(lab_cluster, n1.netns)
    assert out == {keys[0]: to[0], keys[1]: to[1], keys[2]: 0}, (out, left)
    assert f"dst={targets[0].ip}" not in left and f"dst={targets[1].ip}" not in left
    assert f"dst={targets[2].ip}" in left


def test_flush_stale_leaves_a_tcp_flow_to_a_udp_targets_address_and_port(
    lab_cluster: Cluster,
) -> None:
    """Several targets (the read filtered here, not in the kernel): a TCP flow to a UDP
    target's address and port is not that target's, and stays."""
    n1 = lab_cluster.node("node-1")
    client = n1.pods[1]
    a, b = (lab_cluster.node(n).pods[0] for n in ("node-2", "node-3"))
    rule = ["FORWARD", "-m", "conntrack", "--ctstate", "NEW", "-j", "ACCEPT"]
    lab_cluster.exec(n1.netns, "iptables", "-A", *rule)
    try:
        netns.udp_request(client.netns, a.ip, 8080, source_port=43000)
        netns.udp_request(client.netns, b.ip, 8080, source_port=43001)
        netns.tcp_request(client.netns, a.ip, 8080)
    finally:
        lab_cluster.exec(n1.netns, "iptables", "-D", *rule)
    tcp = lab_cluster.exec(n1.netns, "conntrack", "-L", "-p", "tcp").stdout
    tcp_to_a = tcp.count(f"dst={a.ip} sport=")
    assert tcp_to_a >= 1, tcp
    ka, kb = ServiceKey(a.ip, Protocol.UDP, 8080), ServiceKey(b.ip, Protocol.UDP, 8080)
    with netns.entered(n1.netns):
        ct = Conntrack()
        try:
            out = ct.flush_stale({ka: Stale({"10.244.9.9"}), kb: Stale({"10.244.9.9"})})
        finally:
            ct.close()
    assert all(isinstance(n, int) and n >= 1 for n in out.values()) and len(out) == 2, out
    after = lab_cluster.exec(n1.netns, "conntrack", "-L", "-p", "tcp").stdout
    assert after.count(f"dst={a.ip} sport=") == tcp_to_a, after
    assert f"dst={a.ip}" not in flows(lab_cluster, n1.netns)


def test_flush_stale_deletes_ipv6_flows_only_of_their_target(lab_cluster: Cluster) -> None:
    """The same over IPv6: entries of family inet6 are read and deleted as IPv4's are."""
    n1 = lab_cluster.node("node-1")
    client, a = n1.pods[1], n1.pods[0]
    b, other = lab_cluster.node("node-2").pods[0], lab_cluster.node("node-3").pods[0]
    rule = ["FORWARD", "-m", "conntrack", "--ctstate", "NEW", "-j", "ACCEPT"]
    lab_cluster.exec(n1.netns, "ip6tables", "-A", *rule)
    try:
        netns.udp_request(client.netns, b.ip6, 8080, source_port=41010)
        netns.udp_request(client.netns, other.ip6, 8080, source_port=41011)
        before = lab_cluster.exec(n1.netns, "conntrack", "-L", "-f", "ipv6", "-p", "udp").stdout
        assert f"dst={b.ip6}" in before and f"dst={other.ip6}" in before
        key = ServiceKey(b.ip6, Protocol.UDP, 8080)
        with netns.entered(n1.netns):
            ct = Conntrack()
            try:
                kept = ct.flush_stale({key: Stale({b.ip6})})  # answered by a live one
                gone = ct.flush_stale({key: Stale({a.ip6})})
            finally:
                ct.close()
        assert kept == {key: 0} and gone == {key: 1}
        after = lab_cluster.exec(n1.netns, "conntrack", "-L", "-f", "ipv6", "-p", "udp").stdout
        assert f"dst={b.ip6}" not in after and f"dst={other.ip6}" in after
    finally:
        lab_cluster.exec(n1.netns, "ip6tables", "-D", *rule)
