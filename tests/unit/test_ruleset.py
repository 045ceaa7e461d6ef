"""The rendered iptables ruleset: upstream's chains, order and conditional rules."""

from __future__ import annotations

import pytest

from ipvsproxy.core import ipset_specs, ruleset
from ipvsproxy.core.desired import DesiredState
from ipvsproxy.core.plan import NodeFacts, OutFilter, PlanConfig, ServicePlan, plan_service
from ipvsproxy.core.ruleset import RulesConfig, render
from ipvsproxy.core.virtual_servers import Protocol
from tests.unit.k8s_objects import service

ALL = frozenset(ipset_specs.NAMES)


def lines(text: str, chain: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(f"-A {chain} ")]


def test_only_our_chains_are_declared_and_builtins_untouched() -> None:
    text = render(RulesConfig(), ALL, [])
    declared = [ln for ln in text.splitlines() if ln.startswith(":")]
    assert all(ln.split()[0][1:].startswith("KUBE-") for ln in declared)
    for builtin in ("INPUT", "OUTPUT", "FORWARD", "PREROUTING", "POSTROUTING"):
        assert not any(ln.startswith(f"-A {builtin} ") for ln in text.splitlines())
    assert text.count("COMMIT") == 2
    assert text.splitlines()[0] == "*nat"


def test_cluster_ip_masquerade_follows_the_local_detector() -> None:
    def masq(cfg: RulesConfig) -> str:
        (rule,) = [
            r
            for r in lines(render(cfg, ALL, []), "KUBE-SERVICES")
            if "KUBE-MARK-MASQ" in r and ipset_specs.CLUSTER_IP in r
        ]
        return rule

    assert "dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ" in masq(
        RulesConfig(cluster_cidr="10.244.0.0/16")
    )
    assert "dst,dst -j KUBE-MARK-MASQ" in masq(RulesConfig(masquerade_all=True))
    assert "src,dst -j KUBE-MARK-MASQ" in masq(RulesConfig())


def test_masquerade_bit_sets_the_mark() -> None:
    text = render(RulesConfig(masquerade_bit=5), ALL, [])
    assert "-A KUBE-MARK-MASQ -j MARK --or-mark 0x20" in text
    assert "-A KUBE-POSTROUTING -m mark ! --mark 0x20/0x20 -j RETURN" in text


def test_rules_for_empty_sets_are_left_out_but_the_filter_stays() -> None:
    text = render(RulesConfig(), frozenset(), [])
    assert "KUBE-LOOP-BACK" not in text
    assert "--match-set KUBE-NODE-PORT-TCP" not in text
    # The IPVS filter (kubernetes #72236) is always there.
    assert lines(text, "KUBE-IPVS-FILTER")[-1] == (
        "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW "
        "-m set --match-set KUBE-IPVS-IPS dst -j REJECT"
    )
    assert "-A KUBE-SOURCE-RANGES-FIREWALL -j DROP" in text


def test_upstream_order_in_kube_services_and_postrouting() -> None:
    text = render(RulesConfig(cluster_cidr="10.244.0.0/16"), ALL, [])
    svc = lines(text, "KUBE-SERVICES")
    assert svc[0] == "-A KUBE-SERVICES -s 127.0.0.0/8 -j RETURN"
    assert "KUBE-LOAD-BALANCER dst,dst -j KUBE-LOAD-BALANCER" in svc[1]
    assert (
        svc.index("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT") < len(svc) - 2
    )
    assert svc[-2:] == [
        "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT",
        "-A KUBE-SERVICES -m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT",
    ]
    post = lines(text, "KUBE-POSTROUTING")
    assert "KUBE-LOOP-BACK dst,dst,src -j MASQUERADE" in post[0]
    assert post[-1].endswith("-j MASQUERADE --random-fully")


def test_out_filter_rules() -> None:
    text = render(RulesConfig(), ALL, [OutFilter("203.0.113.5", Protocol.TCP, 443)])
    assert lines(text, "KUBE-IPVS-OUT-FILTER") == [
        "-A KUBE-IPVS-OUT-FILTER -s 203.0.113.5 -m ipvs --vaddr 203.0.113.5 --vproto tcp "
        "--vport 443 -j DROP"
    ]


def test_the_text_does_not_depend_on_the_order_services_came_in() -> None:
    """The text is compared with the one last written (its digest survives a restart), so the
    same Services, updated in any order, render the same text, out filters sorted."""
    node = NodeFacts("node-1", ("192.168.56.11",), frozenset({"192.168.56.11"}), "192.168.56.11")
    plans: dict[str, ServicePlan] = {}
    for name, vip, proto, port in (
        ("b", "203.0.113.6", "UDP", 53),
        ("a", "203.0.113.5", "TCP", 443),
        ("c", "203.0.113.5", "TCP", 80),
    ):
        svc = service(
            name,
            f"10.96.0.{len(plans) + 1}",
            type="LoadBalancer",
            ports=[{"name": "p", "port": port, "nodePort": 30000 + port, "protocol": proto}],
            loadBalancerSourceRanges=["192.0.2.0/24"],  # not the node: an out filter each
            status={"loadBalancer": {"ingress": [{"ip": vip}]}},
        )
        plans[f"default/{name}"] = plan_service(svc, [], node, PlanConfig())
    texts = set()
    for order in (
        sorted(plans),
        sorted(plans, reverse=True),
        ["default/b", "default/a", "default/c"],
    ):
        state = DesiredState()
        for name in order:
            state.update(name, plans[name])
        texts.add(render(RulesConfig(), state.nonempty_sets(), state.out_filters()))
    (text,) = texts
    assert [r.split()[3] + " " + r.split()[9] for r in lines(text, "KUBE-IPVS-OUT-FILTER")] == [
        "203.0.113.5 tcp",
        "203.0.113.5 tcp",
        "203.0.113.6 udp",
    ]
    assert "--vport 80 " in lines(text, "KUBE-IPVS-OUT-FILTER")[0]


def test_every_local_traffic_detector() -> None:
    def masq(cfg: RulesConfig) -> str:
        text = render(cfg, ALL, [])
        (rule,) = [
            r for r in lines(text, "KUBE-SERVICES") if "CLUSTER-IP dst,dst " in r and "MASQ" in r
        ]
        return rule

    assert "! -s 10.244.1.0/24 -j" in masq(
        RulesConfig(detect_local="NodeCIDR", local_value="10.244.1.0/24")
    )
    assert "! -i cni0 -j" in masq(RulesConfig(detect_local="BridgeInterface", local_value="cni0"))
    assert "! -i veth+ -j" in masq(
        RulesConfig(detect_local="InterfaceNamePrefix", local_value="veth")
    )
    with pytest.raises(ValueError, match="Bogus"):
        render(RulesConfig(detect_local="Bogus", local_value="x"), ALL, [])


def test_local_policy_without_local_endpoints_short_circuits_pods_and_the_node() -> None:
    """The node itself is masqueraded to the cluster's endpoints, pods keep their address (as
    upstream's: tests/differential); new connections from anyone else are dropped (issue 13
    B9)."""
    sets = frozenset({ipset_specs.NO_LOCAL_ENDPOINTS, ipset_specs.EXTERNAL_IP_LOCAL})
    for cfg in (RulesConfig(cluster_cidr="10.244.0.0/16"), RulesConfig()):
        svc = lines(render(cfg, sets, []), "KUBE-SERVICES")
        masq = [r for r in svc if "KUBE-NO-LOCAL-ENDPOINTS dst,dst" in r]
        assert [r.split("dst,dst ")[1] for r in masq] == [
            "-m addrtype --src-type LOCAL -j KUBE-MARK-MASQ",
        ]
        # Before the external IPs' ACCEPT, which would end the chain for the node.
        first_accept = next(i for i, r in enumerate(svc) if r.endswith("-j ACCEPT"))
        assert svc.index(masq[-1]) < first_accept
    text = render(RulesConfig(cluster_cidr="10.244.0.0/16"), sets, [])
    fw = [r for r in lines(text, "KUBE-PROXY-FIREWALL") if "KUBE-NO-LOCAL-ENDPOINTS" in r]
    assert len(fw) == 1 and fw[0].endswith(
        "dst,dst -m conntrack --ctstate NEW ! -s 10.244.0.0/16 -m addrtype ! --src-type LOCAL"
        " -j DROP"
    )
    assert ipset_specs.NO_LOCAL_ENDPOINTS not in render(RulesConfig(), frozenset(), [])


def test_the_local_detector_defaults() -> None:
    # No mode given: ClusterCIDR with the cluster CIDR; NodeCIDR needs its own value.
    assert RulesConfig(detect_local="", cluster_cidr="10.244.0.0/16").if_not_local() == (
        "! -s 10.244.0.0/16"
    )
    assert RulesConfig(detect_local="NodeCIDR", cluster_cidr="10.244.0.0/16").if_not_local() is None


def test_rendered_chains_are_each_familys_chains_with_their_lines() -> None:
    text = ruleset.render_families(ruleset.RulesConfig(), frozenset(), [], (4, 6))
    chains = ruleset.rendered_chains(text)
    tables = {"nat": ruleset.NAT_CHAINS, "filter": ruleset.FILTER_CHAINS}
    assert set(chains) == {(f, t, c) for f in (4, 6) for t, cs in tables.items() for c in cs}
    assert chains[(4, "nat", "KUBE-MARK-MASQ")][0] == ":KUBE-MARK-MASQ - [0:0]"
    assert all(
        ln.startswith("-A KUBE-MARK-MASQ ") for ln in chains[(6, "nat", "KUBE-MARK-MASQ")][1:]
    )
