"""Properties of the differ and the desired-state aggregate (hypothesis, no kernel).

- Applying the operations of diff(A -> B) to a kernel holding A yields B.
- A Service unchanged between two cluster states yields no changes and no operations.
- Updating plans incrementally gives the same desired state as building it from scratch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ipvsproxy.core.desired import Changes, DesiredState
from ipvsproxy.core.diff import (
    DestOp,
    OpKind,
    ServiceOp,
    adopt_dests,
    adopt_member_parts,
    adopt_members,
    adopt_services,
    diff_addresses,
    diff_dests,
    diff_members,
    diff_services,
)
from ipvsproxy.core.plan import NodeFacts, PlanConfig, plan_service
from ipvsproxy.core.virtual_servers import (
    SVC_F_HASHED,
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

keys = st.builds(
    ServiceKey,
    st.sampled_from([f"10.96.0.{i}" for i in range(1, 6)]),
    st.sampled_from(list(Protocol)),
    st.sampled_from([80, 443]),
)
SCHEDULERS = st.sampled_from(["rr", "lc", "mh"])
FLAGS = st.sampled_from([0, SVC_F_PERSISTENT, 0x10, SVC_F_PERSISTENT | 0x10])
TIMEOUTS = st.sampled_from([0, 60, 10800])  # persistence timeout
NETMASKS = st.sampled_from([-1, 24, 32])  # persistence netmask: -1 and 32 are one for IPv4
vservers = st.builds(VirtualServer, keys, SCHEDULERS, FLAGS, TIMEOUTS, NETMASKS)
dkeys = st.builds(DestKey, st.sampled_from([f"10.244.1.{i}" for i in range(1, 6)]), st.just(8080))
reals = st.builds(RealServer, dkeys, st.integers(0, 3))


def vs_settings(vs: VirtualServer) -> tuple[str, int, int, int]:
    return vs.scheduler, vs.flags & ~SVC_F_HASHED, vs.timeout, vs.prefix_len


def apply_services(
    kernel: dict[ServiceKey, VirtualServer], ops: list[ServiceOp]
) -> dict[ServiceKey, VirtualServer]:
    out = dict(kernel)
    for op in ops:
        if op.kind is OpKind.ADD:
            assert op.server.key not in out
            out[op.server.key] = op.server
        elif op.kind is OpKind.SET:
            assert op.server.key in out
            out[op.server.key] = op.server
        else:
            del out[op.server.key]
    return out


@st.composite
def before_after(draw: st.DrawFn) -> tuple[list[VirtualServer], list[VirtualServer]]:
    """Virtual servers before, and after: some of them kept, some with one setting changed
    (scheduler, flags, persistence timeout or netmask), some gone, some new."""
    a = draw(st.lists(vservers))
    b = draw(st.lists(vservers))
    for vs in a:
        change = draw(st.sampled_from(["keep", "drop", "scheduler", "flags", "timeout", "netmask"]))
        if change == "keep":
            b.append(vs)
        elif change == "scheduler":
            b.append(replace(vs, scheduler=draw(SCHEDULERS)))
        elif change == "flags":
            b.append(replace(vs, flags=draw(FLAGS)))
        elif change == "timeout":
            b.append(replace(vs, timeout=draw(TIMEOUTS)))
        elif change == "netmask":
            b.append(replace(vs, netmask=draw(NETMASKS)))
    return a, b


@given(before_after())
def test_service_diff_applied_to_a_yields_b(
    ab: tuple[list[VirtualServer], list[VirtualServer]],
) -> None:
    a, b = ab
    have = {v.key: v for v in a}
    want = {v.key: v for v in b}
    result = apply_services(have, diff_services(want, have, owned=lambda _k: True))
    assert set(result) == set(want)
    # Every setting as desired (spelled out: same_settings is under test too).
    assert {k: vs_settings(v) for k, v in result.items()} == {
        k: vs_settings(v) for k, v in want.items()
    }
    # And a second diff finds nothing to do.
    assert diff_services(want, result, owned=lambda _k: True) == []


@given(st.lists(vservers), st.lists(vservers))
def test_service_diff_never_deletes_what_is_not_ours(
    a: list[VirtualServer], b: list[VirtualServer]
) -> None:
    have = {v.key: v for v in a}
    want = {v.key: v for v in b}
    ops = diff_services(want, have, owned=lambda k: k.address != "10.96.0.1")
    assert not any(op.kind is OpKind.DELETE and op.server.key.address == "10.96.0.1" for op in ops)


def apply_dests(
    kernel: Mapping[DestKey, ObservedDest], ops: list[DestOp]
) -> dict[DestKey, ObservedDest]:
    out = dict(kernel)
    for op in ops:
        if op.kind is OpKind.DELETE:
            del out[op.server.key]
        else:
            stats = out[op.server.key].stats if op.server.key in out else DestStats()
            out[op.server.key] = ObservedDest(op.server, stats)
    return out


# Real servers as read back (with active and inactive connections) and as desired, for one
# virtual server.
ReadBack = tuple[RealServer, int, int]
read_backs = st.lists(st.tuples(reals, st.integers(0, 2), st.integers(0, 2)))


def dest_case(
    a: list[ReadBack], b: list[RealServer], proto: Protocol
) -> tuple[ServiceKey, dict[DestKey, ObservedDest], dict[DestKey, RealServer]]:
    have = {rs.key: ObservedDest(rs, DestStats(active=act, inactive=ina)) for rs, act, ina in a}
    return ServiceKey("10.96.0.1", proto, 80), have, {rs.key: rs for rs in b}


@given(read_backs, st.lists(reals), st.sampled_from(list(Protocol)))
def test_dest_diff_applied_to_a_yields_b_with_graceful_termination(
    a: list[ReadBack], b: list[RealServer], proto: Protocol
) -> None:
    svc, have, want = dest_case(a, b, proto)
    result = apply_dests(have, diff_dests(svc, want, have))
    for key, rs in want.items():
        assert result[key].server == rs
    for key, seen in have.items():
        if key in want:
            continue
        busy = seen.stats.active > 0 or seen.stats.inactive > 0  # (not .idle: under test)
        if proto is Protocol.TCP and busy:
            # Busy (active or inactive connections), TCP: kept, drained at weight 0. UDP and
            # SCTP ones go at once (upstream's IsRsGracefulTerminationNeeded).
            assert result[key].server.weight == 0 and result[key].stats == seen.stats
        else:
            assert key not in result
    # Once the grace period expires, everything unwanted goes.
    final = apply_dests(result, diff_dests(svc, want, result, expired=set(result)))
    assert set(final) == set(want)


@given(read_backs, st.lists(reals), st.sampled_from(list(Protocol)))
def test_adopting_a_read_back_changes_no_decision(
    a: list[ReadBack], b: list[RealServer], proto: Protocol
) -> None:
    """A full sync holds real servers already as desired as the desired objects (no copy);
    the operations it derives are the same as from the kernel's own copies."""
    svc, have, want = dest_case(a, b, proto)
    kept = adopt_dests(want, have)
    assert set(kept) == set(have)
    for key, seen in kept.items():
        if key in want and want[key].same_settings(have[key].server):
            assert seen is want[key]
        else:
            assert seen is have[key]  # with its connection counts, for drain decisions
    assert diff_dests(svc, want, kept) == diff_dests(svc, want, have)


@given(st.lists(vservers), st.lists(vservers))
def test_adopted_virtual_servers_are_the_desired_objects_where_as_desired(
    a: list[VirtualServer], b: list[VirtualServer]
) -> None:
    have = {vs.key: vs for vs in a}
    want = {vs.key: vs for vs in b}
    kept = adopt_services(want, have.values())
    assert kept.keys() == have.keys()
    for key, vs in kept.items():
        same = key in want and want[key].same_settings(have[key])
        assert vs is (want[key] if same else have[key])
    assert diff_services(want, kept, lambda k: True) == diff_services(want, have, lambda k: True)


@given(st.sets(st.text(min_size=1, max_size=3)), st.sets(st.text(min_size=1, max_size=3)))
def test_adopted_members_are_the_desired_strings(a: set[str], b: set[str]) -> None:
    have = {"".join(e) for e in a}  # equal strings, other objects than b's
    kept = adopt_members(b, have)
    assert kept == have and kept is not have
    for e in kept:
        if e in b:
            assert any(e is x for x in b)  # the desired string itself


@given(
    st.dictionaries(st.sampled_from("ABC"), st.lists(st.sets(st.text(min_size=1, max_size=3)))),
    st.dictionaries(st.sampled_from("ABCD"), st.sets(st.text(min_size=1, max_size=3))),
)
def test_sets_adopted_part_by_part_are_adopted_whole(
    read: dict[str, list[set[str]]], desired: dict[str, set[str]]
) -> None:
    """Each set as the dump parts it (its parts in a row), entries as other string objects."""
    parts = [(n, ["".join(list(e)) for e in part]) for n, ps in read.items() for part in ps]
    kept = adopt_member_parts(lambda n: desired.get(n, set()), parts)
    assert kept.keys() == {n for n, _ in parts}
    for name, entries in kept.items():
        whole = {e for n, part in parts if n == name for e in part}
        assert entries == adopt_members(desired.get(name, set()), whole)
        for e in entries:
            if e in desired.get(name, set()):
                assert any(x is e for x in desired[name])  # the desired string itself


@given(st.sets(st.text(min_size=1, max_size=3)), st.sets(st.text(min_size=1, max_size=3)))
def test_member_and_address_diffs(a: set[str], b: set[str]) -> None:
    members = set(a)
    for op in diff_members("S", b, a):
        (members.add if op.kind is OpKind.ADD else members.discard)(op.entry)
    assert members == b
    addresses = set(a)
    for aop in diff_addresses(b, a, owned=lambda _x: True):
        (addresses.add if aop.kind is OpKind.ADD else addresses.discard)(aop.address)
    assert addresses == b


NODE = NodeFacts("node-1", ("192.168.56.11",), frozenset({"192.168.56.11"}), "192.168.56.11")
ips = st.sampled_from([f"10.244.{n}.{i}" for n in (1, 2) for i in range(1, 5)])


@st.composite
def clusters(draw: st.DrawFn) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Up to 6 Services, each with a type, policy, protocol, affinity and some endpoints;
    some share an external IP, or claim another one's cluster IP as theirs: two Services on
    one virtual server."""
    out = {}
    for i in draw(st.sets(st.integers(1, 6))):
        name = f"svc-{i}"
        stype = draw(st.sampled_from(["ClusterIP", "NodePort", "LoadBalancer"]))
        extra: dict[str, Any] = {}
        if stype != "ClusterIP":
            extra["externalTrafficPolicy"] = draw(st.sampled_from(["Cluster", "Local"]))
        timeout = draw(st.sampled_from([None, 60, 10800]))
        if timeout:
            extra["sessionAffinity"] = "ClientIP"
            extra["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": timeout}}
        shared = draw(st.sampled_from([None, "198.51.100.1", "10.96.0.1", "10.96.0.2"]))
        if shared and shared != f"10.96.0.{i}":
            extra["externalIPs"] = [shared]
        protocol = draw(st.sampled_from(["TCP", "UDP"]))
        port = {"name": "http", "port": 80, "protocol": protocol}
        if stype != "ClusterIP":
            port["nodePort"] = 30000 + i
        status = (
            {"loadBalancer": {"ingress": [{"ip": f"203.0.113.{i}"}]}}
            if stype == "LoadBalancer"
            else None
        )
        svc = service(name, f"10.96.0.{i}", ports=[port], type=stype, status=status, **extra)
        eps = [
            endpoint(ip, node="node-1" if ip.startswith("10.244.1.") else "node-2")
            for ip in draw(st.sets(ips, max_size=4))
        ]
        created = draw(st.sampled_from([None, "2026-01-01T00:00:00Z", "2026-02-01T00:00:00Z"]))
        if created:
            svc["metadata"]["creationTimestamp"] = created
        sl_ports = [{"name": "http", "port": 8080, "protocol": protocol}]
        out[name] = (svc, endpoint_slice(name, eps, ports=sl_ports))
    return out


def build(cluster: dict[str, tuple[dict[str, Any], dict[str, Any]]]) -> DesiredState:
    state = DesiredState()
    for name, (svc, sl) in sorted(cluster.items()):
        state.update(f"default/{name}", plan_service(svc, [sl], NODE, PlanConfig()))
    return state


def snapshot(state: DesiredState) -> tuple[Any, ...]:
    return (
        dict(state.virtual_servers),
        {k: dict(v) for k, v in state.real_servers.items()},
        dict(state.bind_refs),
        {n: dict(c) for n, c in state.member_refs.items() if c},
        dict(state.out_filter_refs),
    )


@settings(max_examples=60)
@given(clusters(), clusters())
def test_incremental_updates_equal_a_fresh_build(
    a: dict[str, tuple[dict[str, Any], dict[str, Any]]],
    b: dict[str, tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    state = build(a)
    vs_before, rs_before, bind_before, members_before, _ = snapshot(state)
    changes = Changes()
    for name in sorted(set(a) | set(b)):
        svc, sl = b.get(name, (None, None))
        plan = plan_service(svc, [sl] if sl else [], NODE, PlanConfig())
        changes.merge(state.update(f"default/{name}", plan))
    assert snapshot(state) == snapshot(build(b))
    # Every key whose desired value differs now was reported as changed (a sync compares and
    # writes only those).
    vs_after, rs_after, bind_after, members_after, _ = snapshot(state)
    assert {
        k
        for k in vs_before.keys() | vs_after.keys()
        if vs_before.get(k) != vs_after.get(k) or rs_before.get(k) != rs_after.get(k)
    } <= changes.services
    assert bind_before.keys() ^ bind_after.keys() <= changes.addresses
    for name in members_before.keys() | members_after.keys():
        was, now = members_before.get(name, {}), members_after.get(name, {})
        assert was.keys() ^ now.keys() <= changes.members.get(name, set())


@settings(max_examples=60)
@given(clusters())
def test_an_unchanged_service_yields_no_changes(
    a: dict[str, tuple[dict[str, Any], dict[str, Any]]],
) -> None:
    state = build(a)
    for name, (svc, sl) in a.items():
        assert not state.update(f"default/{name}", plan_service(svc, [sl], NODE, PlanConfig()))


@pytest.mark.parametrize("proto", [Protocol.UDP, Protocol.SCTP])
def test_busy_udp_and_sctp_real_servers_go_at_once(proto: Protocol) -> None:
    busy = RealServer(DestKey("10.244.1.11", 8080))
    svc, have, want = dest_case([(busy, 2, 0)], [], proto)
    assert diff_dests(svc, want, have) == [DestOp(OpKind.DELETE, svc, busy)]
    svc, have, want = dest_case([(busy, 2, 0)], [], Protocol.TCP)
    drained = RealServer(busy.key, weight=0, fwd_method=busy.fwd_method)
    assert diff_dests(svc, want, have) == [DestOp(OpKind.SET, svc, drained)]
