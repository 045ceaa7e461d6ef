"""The differ and the desired-state aggregate, case by case (pure: no kernel)."""

from __future__ import annotations

from ipvsproxy.desired import DesiredState
from ipvsproxy.diff import DestOp, OpKind, ServiceOp, diff_dests, diff_services
from ipvsproxy.model import (
    SVC_F_PERSISTENT,
    DestKey,
    DestStats,
    ObservedDest,
    Protocol,
    RealServer,
    ServiceKey,
    VirtualServer,
)
from ipvsproxy.plan import NodeFacts, PlanConfig, plan_service
from tests.host.k8s_objects import endpoint, endpoint_slice, service

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
