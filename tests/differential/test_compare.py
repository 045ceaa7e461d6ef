"""Host tests of the differential tests' pure half: the two nodes' own facts normalise to the
same text, and a difference no ``ALLOWED`` entry names is left unexplained."""

from __future__ import annotations

from tests.differential import compare
from tests.differential.compare import Difference, NodeFacts

NODE2 = NodeFacts(
    "192.168.56.12",
    "10.244.2.1",
    "10.244.2.",
    "192.168.56.13",
    "10.244.3.1",
    "10.244.3.",
    "pod-2-",
    "pod-3-",
)
NODE3 = NodeFacts(
    "192.168.56.13",
    "10.244.3.1",
    "10.244.3.",
    "192.168.56.12",
    "10.244.2.1",
    "10.244.2.",
    "pod-3-",
    "pod-2-",
)

IPVS2 = """\
-A -t 10.96.0.10:80 -s rr -p 60
-a -t 10.96.0.10:80 -r 10.244.2.11:8080 -m -w 1
-a -t 10.96.0.10:80 -r 10.244.3.11:8080 -m -w 0
-A -u 192.168.56.12:30053 -s rr
-a -u 192.168.56.12:30053 -r 10.244.1.11:8080 -m -w 1
-A -t 198.51.100.0:20000 -s rr
"""
IPVS3 = """\
-A -t 10.96.0.10:80 -s rr -p 60
-a -t 10.96.0.10:80 -r 10.244.3.11:8080 -m -w 1
-a -t 10.96.0.10:80 -r 10.244.2.11:8080 -m -w 0
-A -u 192.168.56.13:30053 -s rr
-a -u 192.168.56.13:30053 -r 10.244.1.11:8080 -m -w 1
"""


def test_each_nodes_own_addresses_normalise_to_the_same_table() -> None:
    up, ours = compare.parse_ipvsadm(IPVS2, NODE2), compare.parse_ipvsadm(IPVS3, NODE3)
    assert up == ours
    vs = up[("TCP", "10.96.0.10:80")]
    assert vs.settings() == ("rr", 60, "255.255.255.255")
    assert compare.RealServer("PEER-POD.11:8080", "masq", 0) in vs.real_servers
    assert ("UDP", "NODE:30053") in up and compare.PROBE not in up


def test_a_changed_weight_or_scheduler_is_a_difference() -> None:
    up = compare.parse_ipvsadm(IPVS2, NODE2)
    ours = compare.parse_ipvsadm(IPVS3.replace("-w 0", "-w 1").replace("-p 60", ""), NODE3)
    diffs = compare.diff_ipvs(up, ours)
    assert [str(d) for d in diffs] == [
        "ipvs TCP 10.96.0.10:80 settings: kube-proxy=('rr', 60, '255.255.255.255') "
        "ipvsproxy=('rr', 0, '')",
        "ipvs TCP 10.96.0.10:80 -> PEER-POD.11:8080: kube-proxy='masq w0' ipvsproxy='masq w1'",
    ]
    left, used = compare.unexplained(diffs)
    assert left == diffs and used == {}


def test_ipset_members_normalise_and_differ_by_member() -> None:
    text = (
        "create KUBE-LOOP-BACK hash:ip,port,ip family inet\n"
        "add KUBE-LOOP-BACK {pod}.11,tcp:8080,{pod}.11\n"
        "create KUBE-NODE-PORT-TCP bitmap:port range 0-65535\n"
        "add KUBE-NODE-PORT-TCP 30080\n"
        "create OTHER hash:ip\n"
    )
    up = compare.parse_ipset_save(text.format(pod="10.244.2"), NODE2)
    ours = compare.parse_ipset_save(text.format(pod="10.244.3"), NODE3)
    assert up == ours and set(up) == {"KUBE-LOOP-BACK", "KUBE-NODE-PORT-TCP"}
    assert up["KUBE-LOOP-BACK"].members == {"LOCAL-POD.11,tcp:8080,LOCAL-POD.11"}
    ours["KUBE-NODE-PORT-TCP"] = compare.IPSet("bitmap:port", frozenset({"30081"}))
    assert [str(d) for d in compare.diff_ipsets(up, ours)] == [
        "ipset KUBE-NODE-PORT-TCP 30080: kube-proxy=True ipvsproxy=None",
        "ipset KUBE-NODE-PORT-TCP 30081: kube-proxy=None ipvsproxy=True",
    ]


def test_only_the_named_differences_are_allowed() -> None:
    allowed = [
        Difference("ipset", "KUBE-NO-LOCAL-ENDPOINTS", None, "hash:ip,port"),
        Difference(
            "traffic",
            "etp-local-none/80 TCP loadBalancer from node",
            "timeout",
            (("pod-1-1",), ("NODE",)),
            "etp-local-none",
        ),
    ]
    new = [
        # upstream had the set, ipvsproxy not; IPv6 sets differing either way
        Difference("ipset", "KUBE-NO-LOCAL-ENDPOINTS", "hash:ip,port", None),
        Difference("ipset", "KUBE-6-CLUSTER-IP", "hash:ip,port", None),
        Difference("ipset", "KUBE-6-CLUSTER-IP", None, "hash:ip,port"),
        # the node reaching a Service with no externalTrafficPolicy Local
        Difference(
            "traffic",
            "load-balancer/80 TCP loadBalancer from node",
            "timeout",
            (("pod-1-1",), ("NODE",)),
            "load-balancer",
        ),
        # a pod (not the node) reaching it
        Difference(
            "traffic",
            "etp-local-none/80 TCP loadBalancer from pod",
            "timeout",
            (("pod-1-1",), ("NODE",)),
            "etp-local-none",
        ),
    ]
    left, used = compare.unexplained(allowed + new)
    assert left == new
    assert sorted(used) == ["no-local-endpoints-set", "node-to-external-destinations"]


def test_a_draining_real_server_on_one_node_only_is_drain_timing() -> None:
    key = "TCP 10.96.0.10:80 -> PEER-POD.11:8080"
    draining = [Difference("ipvs", key, "masq w0", None), Difference("ipvs", key, None, "masq w0")]
    assert compare.unexplained(draining)[0] == []
    # Wanted on one node, draining or absent on the other: not timing.
    wrong = [
        Difference("ipvs", key, "masq w1", None),
        Difference("ipvs", key, "masq w1", "masq w0"),
    ]
    assert compare.unexplained(wrong)[0] == wrong


def test_a_traffic_difference_counts_only_if_every_reprobe_shows_it() -> None:
    """Probed again: one the nodes answer the same is transient, one they never do stays, and
    only the shapes still differing are probed."""
    lost = Difference("traffic", "a/80 TCP nodePort from pod", ("x",), ("x", "timeout"), "a")
    kept = Difference("traffic", "b/80 TCP clusterIP from pod", ("x",), "timeout", "b")
    asked: list[set[str]] = []

    def probe(shapes: set[str]) -> tuple[dict[str, object], dict[str, object]]:
        asked.append(shapes)
        up: dict[str, object] = {lost.key: ("x",), kept.key: ("x",)}
        return up, {lost.key: ("x",), kept.key: "timeout"}

    still, transient = compare.reprobe([lost, kept], probe)
    assert (still, transient) == ([kept], [lost])
    assert asked == [{"a", "b"}, {"b"}]
    assert compare.reprobe([kept], probe, times=0) == ([kept], [])


def test_the_ipv6_no_local_endpoints_set_is_ipvsproxys_own_too() -> None:
    """Created when a dual-stack eTP Local Service has no local IPv6 endpoint for a moment (its
    slices arriving one by one), it stays, empty, as the IPv4 one does."""
    d = Difference("ipset", "KUBE-6-NO-LOCAL-ENDPOINTS", None, "hash:ip,port")
    left, used = compare.unexplained([d])
    assert left == [] and list(used) == ["no-local-endpoints-set"]
    reverse = Difference("ipset", "KUBE-6-NO-LOCAL-ENDPOINTS", "hash:ip,port", None)
    assert compare.unexplained([reverse])[0] == [reverse]
