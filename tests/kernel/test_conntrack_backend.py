"""Stale UDP conntrack entries are deleted over netlink, and only the matching ones."""

from __future__ import annotations

import socket

import pytest

from ipvsproxy.core.virtual_servers import Protocol, ServiceKey
from ipvsproxy.kernel.conntrack import Bounds, Conntrack, Stale, Unfinished
from ipvsproxy.kernel.netlink import ct_messages
from ipvsproxy.kernel.netlink.sock import NETLINK_NETFILTER, NetlinkSocket
from lab.net import netns
from lab.net.topology import Cluster, Node, Pod

pytestmark = pytest.mark.kernel

P = 7753  # the port of the entries the tests below create: no traffic of the lab's uses it


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
            # removed real server go, another's stay.
            kept = ct.flush_stale({key: Stale({(b.ip, 8080)}), key3: Stale(set(), {(a.ip, 8080)})})
            assert flows(lab_cluster, n1.netns).count(f"dst={b.ip}") == before.count(f"dst={b.ip}")
            # Not answered by a live one, it goes.
            gone = ct.flush_stale({key: Stale({(a.ip, 8080)})})
        finally:
            ct.close()
    assert kept == {key: 0, key3: 0} and gone == {key: 1}
    after = flows(lab_cluster, n1.netns)
    assert f"dst={b.ip}" not in after
    assert f"dst={other}" in after
    assert ct.counters.ok == {"delete_conntrack": 1}


def test_flush_stale_cleans_many_virtual_servers(lab_cluster: Cluster) -> None:
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
                {keys[0]: Stale({("10.244.9.9", 8080)}), keys[1]: Stale({("10.244.9.9", 8080)}),
                 keys[2]: Stale({(targets[2].ip, 8080)})}
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
    """A TCP flow to a UDP target's address and port is not that target's, and stays."""
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
            out = ct.flush_stale(
                {ka: Stale({("10.244.9.9", 8080)}), kb: Stale({("10.244.9.9", 8080)})}
            )
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
                kept = ct.flush_stale({key: Stale({(b.ip6, 8080)})})  # answered by a live one
                gone = ct.flush_stale({key: Stale({(a.ip6, 8080)})})
            finally:
                ct.close()
        assert kept == {key: 0} and gone == {key: 1}
        after = lab_cluster.exec(n1.netns, "conntrack", "-L", "-f", "ipv6", "-p", "udp").stdout
        assert f"dst={b.ip6}" not in after and f"dst={other.ip6}" in after
    finally:
        lab_cluster.exec(n1.netns, "ip6tables", "-D", *rule)


def insert(ns: str, entries: list[tuple[str, int, str, int, str, int]]) -> None:
    """Create UDP entries in ``ns``'s table, many per system call: each (client, its port,
    destination, its port, the address and port that answer). Traffic would take a fork per
    flow; thousands take seconds this way."""
    with netns.entered(ns), NetlinkSocket(NETLINK_NETFILTER) as sock:
        requests = []
        for client, cport, dst, dport, by, bport in entries:
            fam = socket.AF_INET6 if ":" in dst else socket.AF_INET
            seq = sock.next_seq()
            orig, reply = (client, cport, dst, dport), (by, bport, client, cport)
            requests.append((seq, ct_messages.create_request(fam, seq, orig, reply)))
        refused = [o for o in sock.execute(requests) if not o.ok]
    assert not refused, refused[:3]


def table(cluster: Cluster, ns: str, family: str) -> str:
    return cluster.exec(ns, "conntrack", "-L", "-f", family, "-p", "udp").stdout


@pytest.mark.parametrize(
    ("family", "target", "other", "live", "gone", "client"),
    [
        ("ipv4", "10.96.77.1", "10.96.77.2", "10.244.77.1", "10.244.77.9", "10.0.77.1"),
        ("ipv6", "fd00:96::77:1", "fd00:96::77:2", "fd00:244::77:1", "fd00:244::77:9", "fd00::77"),
    ],
)
def test_flush_stale_matches_address_and_port_and_filters_in_the_kernel(
    lab_cluster: Cluster, family: str, target: str, other: str, live: str, gone: str, client: str
) -> None:
    """Entries to another address or port stay; a real server is its address and port; the
    kernel sends only the target's port's UDP entries (IPv4: its address's too; IPv6: Linux's
    address match is inverted, so the address is matched here)."""
    n1 = lab_cluster.node("node-1")
    entries = [(client, 20000 + i, target, P, gone, P) for i in range(5)]  # stale
    entries += [(client, 20100 + i, target, P, live, P) for i in range(2)]  # live
    entries += [(client, 20200, target, P, live, 5353)]  # live address, another port
    entries += [(client, 20300 + i, other, P, gone, P) for i in range(3)]  # another target
    entries += [(client, 20400 + i, target, P + 1, gone, P + 1) for i in range(3)]  # another port
    insert(n1.netns, entries)
    key = ServiceKey(target, Protocol.UDP, P)
    with netns.entered(n1.netns):
        ct = Conntrack()
        try:
            out = ct.flush_stale({key: Stale({(live, P)})})
        finally:
            ct.close()
    assert out == {key: 6}
    assert ct.examined == (8 if family == "ipv4" else 11)  # never those to port P + 1
    left = table(lab_cluster, n1.netns, family)
    assert left.count(f"dst={target} sport=") == 2 + 3, left
    assert left.count(f"dst={other} sport=") == 3, left
    assert f"src={live} dst={client} sport=5353" not in left


def test_flush_stale_of_a_large_table_reads_only_its_targets_entries_and_is_bounded(
    lab_cluster: Cluster,
) -> None:
    """Thousands of UDP entries to other places: the kernel sends none of them to Python. A
    call deletes at most its bound; the next goes on."""
    n1 = lab_cluster.node("node-1")
    noise = [
        (f"10.0.78.{i // 250}", 30000 + i % 250, f"10.96.78.{i % 200 + 2}", P, "10.244.78.2", P)
        for i in range(5000)
    ]
    target = "10.96.78.1"
    stale_ones = [("10.0.79.1", 31000 + i, target, P, "10.244.78.9", P) for i in range(5)]
    insert(n1.netns, noise + stale_ones)
    key = ServiceKey(target, Protocol.UDP, P)
    with netns.entered(n1.netns):
        ct = Conntrack(bounds=Bounds(examined=100_000, deleted=3))
        try:
            first = ct.flush_stale({key: Stale({("10.244.78.1", P)})})
            second = ct.flush_stale({key: Stale({("10.244.78.1", P)})})
        finally:
            ct.close()
    assert (first, second) == ({key: Unfinished(3)}, {key: 2})
    assert ct.examined == 3 + 2  # the first stopped at its third entry
    assert ct.counters.ok == {"delete_conntrack": 5}
    left = table(lab_cluster, n1.netns, "ipv4")
    assert f"dst={target} " not in left and left.count(f"dport={P} ") >= 5000


def test_flush_stale_of_a_node_ports_virtual_servers_is_one_dump_and_owns_only_its_own(
    lab_cluster: Cluster,
) -> None:
    """A NodePort's virtual servers, one per node address, are one dump filtered by the port;
    each node address's stale entries go, a flow through the node to another host's same
    port stays (upstream's match by port alone would delete it)."""
    n1 = lab_cluster.node("node-1")
    node_ips, foreign, gone = ("10.80.0.1", "10.80.0.2"), "10.80.0.99", "10.244.80.9"
    entries = [("10.0.80.1", 21000 + i, ip, P + 2, gone, P) for i, ip in enumerate(node_ips)]
    entries += [("10.0.80.1", 21100, foreign, P + 2, foreign, P + 2)]  # never NATed
    insert(n1.netns, entries)
    keys = [ServiceKey(ip, Protocol.UDP, P + 2) for ip in node_ips]
    with netns.entered(n1.netns):
        ct = Conntrack()
        try:
            out = ct.flush_stale(dict.fromkeys(keys, Stale({("10.244.80.1", P)})))
        finally:
            ct.close()
    assert out == dict.fromkeys(keys, 1)
    assert ct.examined == 3  # one dump: the port's three entries
    left = table(lab_cluster, n1.netns, "ipv4")
    assert f"dst={foreign} " in left and all(f"dst={ip} " not in left for ip in node_ips)
