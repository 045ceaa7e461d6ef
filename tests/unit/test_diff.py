"""The differ and the desired-state aggregate, case by case (pure: no kernel)."""

from __future__ import annotations

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.desired import Changes, DesiredState
from ipvsproxy.core.diff import (
    AddressOp,
    DestOp,
    MemberOp,
    OpKind,
    ServiceOp,
    diff_addresses,
    diff_dests,
    diff_members,
    diff_services,
)
from ipvsproxy.core.plan import NodeFacts, PlanConfig, plan_service
from ipvsproxy.core.virtual_servers import (
    SVC_F_PERSISTENT,
    DestKey,
    DestStats,
    ObservedDest,
    Protocol,
    RealServer,
    ServiceKey,
    VirtualServer,
)
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

VS = ServiceKey("10.96.0.10", Protocol.TCP, 80)
GONE = DestKey("10.244.1.11", 8080)


def test_a_drained_real_server_is_not_drained_again() -> None:
    draining = {GONE: ObservedDest(RealServer(GONE, weight=0), DestStats(active=1))}
    assert diff_dests(VS, {}, draining) == []


def test_inactive_connections_keep_a_real_server_draining() -> None:
    # FIN_WAIT, TIME_WAIT, ... (InActConn): the connection still has packets to deliver.
    busy = {GONE: ObservedDest(RealServer(GONE), DestStats(active=0, inactive=2))}
    assert diff_dests(VS, {}, busy) == [
        DestOp(OpKind.SET, VS, RealServer(GONE, weight=0)),
    ]
    draining = {GONE: ObservedDest(RealServer(GONE, weight=0), DestStats(inactive=2))}
    assert diff_dests(VS, {}, draining) == []
    # Idle, or past its grace period: deleted.
    idle = {GONE: ObservedDest(RealServer(GONE, weight=0), DestStats())}
    assert diff_dests(VS, {}, idle) == [DestOp(OpKind.DELETE, VS, RealServer(GONE, weight=0))]
    assert diff_dests(VS, {}, draining, expired={GONE}) == [
        DestOp(OpKind.DELETE, VS, RealServer(GONE, weight=0))
    ]


def test_a_changed_affinity_timeout_is_written_and_is_drift() -> None:
    want = VirtualServer(VS, "rr", SVC_F_PERSISTENT, 60)
    have = VirtualServer(VS, "rr", SVC_F_PERSISTENT, 10800)
    assert diff_services({VS: want}, {VS: have}, owned=lambda _k: True) == [
        ServiceOp(OpKind.SET, want)
    ]
    assert not want.same_settings(have)
    # And through the planner: a new timeoutSeconds is a changed virtual server.
    node = NodeFacts("node-1")
    state = DesiredState()
    svc = service("sticky", "10.96.0.10", sessionAffinity="ClientIP")
    state.update("default/sticky", plan_service(svc, [], node, PlanConfig()))
    svc["spec"]["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": 60}}
    changes = state.update("default/sticky", plan_service(svc, [], node, PlanConfig()))
    assert changes.services == {VS}
    assert state.virtual_servers[VS].timeout == 60


def test_a_virtual_server_two_services_claim_stays_while_one_still_does() -> None:
    node = NodeFacts("node-1")
    sl = endpoint_slice("victim", [endpoint("10.244.1.11")])
    victim = plan_service(service("victim", "10.96.0.10"), [sl], node, PlanConfig())
    thief_svc = service("thief", "10.96.0.20", externalIPs=["10.96.0.10"])
    thief = plan_service(thief_svc, [], node, PlanConfig())
    state = DesiredState()
    state.update("default/victim", victim)
    state.update("default/thief", thief)
    assert VS in state.virtual_servers
    # Whichever of the two holds it now, the other one letting go keeps it, as the holder's.
    holder = state.owner[VS]
    other, left = (
        ("default/thief", victim) if holder == "default/victim" else ("default/victim", thief)
    )
    state.update(other, plan_service(None, [], node, PlanConfig()))
    assert state.virtual_servers[VS] == left.virtual_servers[VS]
    assert state.real_servers[VS] == left.real_servers[VS]


def test_a_real_server_back_from_weight_0_is_set_to_weight_1() -> None:
    back = DestKey("10.244.1.11", 8080)  # as planned: weight 1, masquerade
    drained = {back: ObservedDest(RealServer(back, weight=0), DestStats(active=1))}
    assert diff_dests(VS, {back: back}, drained) == [DestOp(OpKind.SET, VS, back)]


def test_member_and_address_operations_name_their_set_and_kind() -> None:
    assert diff_members("KUBE-CLUSTER-IP", {"a"}, {"b"}) == [
        MemberOp(OpKind.ADD, "KUBE-CLUSTER-IP", "a"),
        MemberOp(OpKind.DELETE, "KUBE-CLUSTER-IP", "b"),
    ]
    ops = diff_addresses(
        {"10.96.0.1"}, {"10.96.0.2", "10.96.0.3"}, owned=lambda a: a != "10.96.0.3"
    )
    assert ops == [AddressOp(OpKind.ADD, "10.96.0.1"), AddressOp(OpKind.DELETE, "10.96.0.2")]


def test_changes_are_true_when_any_part_is_and_merge_keeps_every_part() -> None:
    assert not Changes()
    assert Changes(services={VS}) and Changes(addresses={"10.96.0.1"})
    assert Changes(members={"S": {"e"}}) and Changes(rules=True)
    assert not Changes(members={"S": set()})
    merged = Changes()
    merged.merge(Changes(rules=True, members={"S": {"e"}}))
    merged.merge(Changes(members={"S": {"f"}}))
    assert merged.rules and merged.members == {"S": {"e", "f"}}


def test_desired_state_reports_addresses_and_rules_and_answers_for_kube_ipvs_ips() -> None:
    node = NodeFacts("node-1")
    state = DesiredState()
    assert not state.update("default/none", plan_service(None, [], node, PlanConfig()))
    changes = state.update(
        "default/web", plan_service(service("web", "10.96.0.10"), [], node, PlanConfig())
    )
    assert changes.addresses == {"10.96.0.10"}
    assert changes.members[ipset_specs.IPVS_IPS] == {"10.96.0.10"}
    assert changes.rules  # KUBE-CLUSTER-IP and KUBE-IPVS-IPS are no longer empty
    assert set(state.member_keys(ipset_specs.IPVS_IPS)) == {"10.96.0.10"}
    assert state.has_member(ipset_specs.IPVS_IPS, "10.96.0.10")
    assert not state.has_member(ipset_specs.IPVS_IPS, "10.96.0.11")
    assert state.members_among(ipset_specs.IPVS_IPS, {"10.96.0.10", "10.96.0.11"}) == {"10.96.0.10"}
    assert state.members_among(ipset_specs.CLUSTER_IP, {"10.96.0.10,tcp:80", "x"}) == {
        "10.96.0.10,tcp:80"
    }
    assert state.nonempty_sets() == {ipset_specs.CLUSTER_IP, ipset_specs.IPVS_IPS}
    # The same plan again: nothing changed, the rules neither.
    again = state.update(
        "default/web", plan_service(service("web", "10.96.0.10"), [], node, PlanConfig())
    )
    assert not again and not again.rules


def test_a_new_out_filter_alone_changes_the_rules() -> None:
    node = NodeFacts("node-1", ("192.168.56.11",), frozenset({"192.168.56.11"}), "192.168.56.11")

    def lb(name: str, cluster_ip: str, vip: str) -> dict[str, object]:
        return service(
            name,
            cluster_ip,
            type="LoadBalancer",
            ports=[{"name": "p", "port": 443, "nodePort": 30443, "protocol": "TCP"}],
            loadBalancerSourceRanges=["192.0.2.0/24"],  # not the node: an out filter
            status={"loadBalancer": {"ingress": [{"ip": vip}]}},
        )

    state = DesiredState()
    state.update(
        "default/a", plan_service(lb("a", "10.96.0.1", "203.0.113.1"), [], node, PlanConfig())
    )
    before = state.nonempty_sets()
    changes = state.update(
        "default/b", plan_service(lb("b", "10.96.0.2", "203.0.113.2"), [], node, PlanConfig())
    )
    assert state.nonempty_sets() == before  # no set became (non-)empty: only the filter is new
    assert changes.rules
