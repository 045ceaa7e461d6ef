"""The whole dataplane over the fake kernel (``ipvsproxy.kernel.fakes``), each test of the form
"after ``sync()`` the fake holds exactly ...": drift repair, zero-write adoption, drain at
weight 0, UDP removal, foreign state, a refused operation amid a batch, an exception from a
backend. The fakes behave as the kernel does where these tests look
(tests/kernel/test_kernel_conformance.py); the same stories with real traffic are in
tests/kernel/test_dataplane_*.py."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.diff import AddressOp, DestOp, MemberOp, OpKind, ServiceOp
from ipvsproxy.core.plan import PlanConfig
from ipvsproxy.core.ruleset import JUMPS
from ipvsproxy.core.virtual_servers import (
    DestKey,
    Protocol,
    RealServer,
    ServiceKey,
    VirtualServer,
)
from ipvsproxy.dataplane.dataplane import SyncResult
from ipvsproxy.kernel.conntrack import Bounds
from ipvsproxy.kernel.fakes import FakeBackends, fake_backends
from tests.unit.fake_node import NODE_IP, Node, node
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

TCP, UDP = Protocol.TCP, Protocol.UDP
WEB = ServiceKey("10.96.0.10", TCP, 80)
DNS = ServiceKey("10.96.0.53", UDP, 53)
POD_A, POD_B, POD_C = "10.244.1.11", "10.244.2.11", "10.244.3.11"


class Boom(Exception):
    """Neither an ApplyError nor an OSError: what a codec's bug or pyroute2 raise."""


def web(*ips: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return service("web", WEB.address), [endpoint_slice("web", [endpoint(ip) for ip in ips])]


def udp(name: str, ip: str, *ips: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    ports = [{"name": "dns", "port": 53, "protocol": "UDP"}]
    slice_ports = [{"name": "dns", "port": 5353, "protocol": "UDP"}]
    return service(name, ip, ports=ports), [
        endpoint_slice(name, [endpoint(i) for i in ips], ports=slice_ports)
    ]


def dns(*ips: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return udp("dns", DNS.address, *ips)


def node_port(name: str, ip: str, port: int, *ips: str) -> tuple[Any, list[Any]]:
    ports = [{"name": "http", "port": 80, "nodePort": port, "protocol": "TCP"}]
    svc = service(name, ip, type="NodePort", ports=ports, sessionAffinity="ClientIP")
    return svc, [endpoint_slice(name, [endpoint(p) for p in ips])]


def put(n: Node, name: str, obj: tuple[dict[str, Any], list[dict[str, Any]]] | None) -> None:
    if obj is None:
        n.dp.update_service(f"default/{name}", None, [])
    else:
        n.dp.update_service(f"default/{name}", obj[0], obj[1])


def ok(result: SyncResult) -> SyncResult:
    assert (result.errors, result.failed) == ([], {}), (result.errors, result.failed)
    return result


def ipvs_table(kernel: FakeBackends) -> dict[str, dict[str, int]]:
    """Each virtual server ("TCP 10.96.0.10:80 rr") with its real servers' weights."""
    fake = kernel.ipvs
    return {
        f"{key} {vs.scheduler}": {str(d): rs.weight for d, rs in fake.real_servers[key].items()}
        for key, vs in fake.virtual_servers.items()
    }


def holds(kernel: FakeBackends) -> dict[str, Any]:
    """Everything the fake kernel holds, in a form to compare."""
    return {
        "ipvs": ipvs_table(kernel),
        "sets": {name: sorted(m) for name, m in sorted(kernel.ipsets.sets.items())},
        "devices": {name: sorted(d.addresses) for name, d in kernel.addresses.devices.items()},
        "rules": {t: kernel.iptables.save(t) for t in ("nat", "filter")},
    }


def ipvs_writes(n: Node, converge: Callable[[], SyncResult]) -> int:
    """The IPVS writes of ``converge`` (a sync), which must succeed."""
    before = n.kernel.ipvs.counters.writes
    ok(converge())
    return n.kernel.ipvs.counters.writes - before


# -- drift repair ----------------------------------------------------------------------------


def _delete_real_server(k: FakeBackends) -> None:
    del k.ipvs.real_servers[WEB][DestKey(POD_A, 8080)]


def _weight_changed(k: FakeBackends) -> None:
    k.ipvs.real_servers[WEB][DestKey(POD_A, 8080)] = RealServer(DestKey(POD_A, 8080), weight=5)


def _scheduler_changed(k: FakeBackends) -> None:
    k.ipvs.virtual_servers[WEB] = VirtualServer(WEB, "wlc")


def _virtual_server_deleted(k: FakeBackends) -> None:
    del k.ipvs.virtual_servers[WEB], k.ipvs.real_servers[WEB]


def _address_unbound(k: FakeBackends) -> None:
    k.addresses.devices["kube-ipvs0"].addresses.discard(WEB.address)


def _member_deleted(k: FakeBackends) -> None:
    k.ipsets.sets[ipset_specs.CLUSTER_IP].discard("10.96.0.10,tcp:80")


def _stray_member(k: FakeBackends) -> None:
    k.ipsets.sets[ipset_specs.CLUSTER_IP].add("10.96.9.9,tcp:80")


def _jump_deleted(k: FakeBackends) -> None:
    k.iptables.run("nat", f"-D PREROUTING {JUMPS[1].spec()}")


def _chain_flushed(k: FakeBackends) -> None:
    k.iptables.run("nat", "-F KUBE-SERVICES")


# What is changed behind ipvsproxy's back, and the writes that repair it.
DRIFT: dict[str, tuple[Callable[[FakeBackends], None], int]] = {
    "a real server deleted": (_delete_real_server, 1),
    "a real server's weight changed": (_weight_changed, 1),
    "a virtual server's scheduler changed": (_scheduler_changed, 1),
    "a virtual server deleted": (_virtual_server_deleted, 3),  # it and its 2 real servers
    "an address unbound from kube-ipvs0": (_address_unbound, 1),
    "an ipset member deleted": (_member_deleted, 1),
    "a member added to one of our sets": (_stray_member, 1),
    "a jump into our chains deleted": (_jump_deleted, 1),  # one iptables-restore
    "one of our chains flushed": (_chain_flushed, 1),
}


@pytest.mark.parametrize("drift", sorted(DRIFT))
def test_reconcile_repairs_drift_and_then_writes_nothing(tmp_path: Path, drift: str) -> None:
    damage, repairs = DRIFT[drift]
    n = node(tmp_path)
    put(n, "web", web(POD_A, POD_B))
    ok(n.sync())
    healthy = holds(n.kernel)
    assert ok(n.reconcile()).writes == 0  # nothing drifted: nothing written
    damage(n.kernel)
    assert holds(n.kernel) != healthy
    assert ok(n.sync()).writes == 0  # an incremental sync does not look at the kernel
    assert ok(n.reconcile()).writes == repairs
    assert holds(n.kernel) == healthy
    assert ok(n.reconcile()).writes == 0


# -- adoption ----------------------------------------------------------------------------------


def test_a_restart_over_a_programmed_kernel_and_its_state_file_writes_nothing(
    tmp_path: Path,
) -> None:
    objects = {
        "web": web(POD_A, POD_B),
        "dns": dns(POD_A, POD_C),
        "np": node_port("np", "10.96.0.30", 30080, POD_B),
    }
    first = node(tmp_path)
    for name, obj in objects.items():
        put(first, name, obj)
    assert ok(first.sync()).writes > 0
    programmed = holds(first.kernel)
    reads = first.kernel.ipvs.calls["dests"]

    second = node(tmp_path, first.kernel)  # the same kernel and state file, a new process
    for name, obj in objects.items():
        put(second, name, obj)
    result = ok(second.sync())
    assert result.full and result.writes == 0 and result.sysctls_set == []
    assert holds(second.kernel) == programmed
    assert first.kernel.ipvs.calls["dests"] > reads  # it read the kernel back


# -- drain -------------------------------------------------------------------------------------


@pytest.mark.parametrize("until", ["its connections end", "its grace period is over"])
def test_a_removed_real_server_with_connections_drains_at_weight_0_then_goes(
    tmp_path: Path, until: str
) -> None:
    n = node(tmp_path, grace_seconds=60)
    put(n, "web", web(POD_A, POD_B))
    ok(n.sync())
    n.kernel.ipvs.set_connections(WEB, DestKey(POD_B, 8080), active=2, inactive=1)
    put(n, "web", web(POD_A))
    assert ipvs_writes(n, n.sync) == 1
    draining = {f"{WEB} rr": {f"{POD_A}:8080": 1, f"{POD_B}:8080": 0}}
    assert ipvs_table(n.kernel) == draining
    n.now[0] += 30
    assert ok(n.sync()).writes == 0 and ipvs_table(n.kernel) == draining
    assert ok(n.reconcile()).writes == 0 and ipvs_table(n.kernel) == draining
    if until == "its connections end":
        n.kernel.ipvs.set_connections(WEB, DestKey(POD_B, 8080))
    else:
        n.now[0] += 30
    assert ok(n.sync()).writes == 1  # nothing else changed: the delete alone
    assert ipvs_table(n.kernel) == {f"{WEB} rr": {f"{POD_A}:8080": 1}}
    assert n.dp.state.draining_since == {}


def test_an_idle_removed_real_server_goes_at_once(tmp_path: Path) -> None:
    n = node(tmp_path)
    put(n, "web", web(POD_A, POD_B))
    ok(n.sync())
    put(n, "web", web(POD_A))
    assert ipvs_writes(n, n.sync) == 1
    assert ipvs_table(n.kernel) == {f"{WEB} rr": {f"{POD_A}:8080": 1}}


def test_a_real_server_back_while_draining_serves_again(tmp_path: Path) -> None:
    n = node(tmp_path)
    put(n, "web", web(POD_A, POD_B))
    ok(n.sync())
    n.kernel.ipvs.set_connections(WEB, DestKey(POD_B, 8080), active=1)
    put(n, "web", web(POD_A))
    ok(n.sync())
    put(n, "web", web(POD_A, POD_B))
    assert ipvs_writes(n, n.sync) == 1
    assert ipvs_table(n.kernel) == {f"{WEB} rr": {f"{POD_A}:8080": 1, f"{POD_B}:8080": 1}}
    assert n.dp.state.draining_since == {}


# -- UDP ---------------------------------------------------------------------------------------


def test_a_removed_udp_real_server_goes_at_once_with_its_conntrack_entries(
    tmp_path: Path,
) -> None:
    n = node(tmp_path)
    put(n, "dns", dns(POD_A, POD_B))
    ok(n.sync())
    # Flushed when its real servers came (entries made while it had none go).
    assert n.kernel.conntrack.flushes == [
        (DNS, frozenset({(POD_A, 5353), (POD_B, 5353)}), frozenset())
    ]
    for pod in (POD_A, POD_B, POD_B):
        n.kernel.conntrack.add_flow(DNS, (pod, 5353))
    put(n, "dns", dns(POD_A))
    assert ipvs_writes(n, n.sync) == 1
    assert ipvs_table(n.kernel) == {f"{DNS} rr": {f"{POD_A}:5353": 1}}
    assert n.kernel.conntrack.flushes[1:] == [
        (DNS, frozenset({(POD_A, 5353)}), frozenset({(POD_B, 5353)}))
    ]
    assert n.kernel.conntrack.flows == {DNS: [(POD_A, 5353)]}
    assert n.kernel.conntrack.counters.ok == {"delete_conntrack": 2}
    # Its last real server gone: the flows it answered go too (upstream would keep them).
    n.kernel.conntrack.add_flow(DNS, (POD_A, 5353))
    put(n, "dns", dns())
    ok(n.sync())
    assert ipvs_table(n.kernel) == {f"{DNS} rr": {}}
    assert n.kernel.conntrack.flows == {DNS: []}
    # Nothing changed: nothing flushed.
    ok(n.sync())
    assert len(n.kernel.conntrack.flushes) == 3


def test_a_sync_reads_the_conntrack_table_once_for_all_its_udp_services(
    tmp_path: Path,
) -> None:
    """Every UDP virtual server a sync changed is cleaned from one read of the table: one
    read each made a cold sync's cleanup cost more than its IPVS writes."""
    n = node(tmp_path)
    for i in range(5):
        put(n, f"dns{i}", udp(f"dns{i}", f"10.96.1.{i + 1}", POD_A, POD_B))
    ok(n.sync())
    assert n.kernel.conntrack.reads == 1
    assert len(n.kernel.conntrack.flushes) == 5
    for i in range(3):
        put(n, f"dns{i}", udp(f"dns{i}", f"10.96.1.{i + 1}", POD_A))
    ok(n.sync())
    assert n.kernel.conntrack.reads == 2
    assert {f[0].address for f in n.kernel.conntrack.flushes[5:]} == {
        "10.96.1.1", "10.96.1.2", "10.96.1.3"
    }  # fmt: skip


def test_a_flow_answered_by_a_live_address_on_another_port_is_stale(tmp_path: Path) -> None:
    """As upstream, a real server is its address and port: a flow answered by a live pod's
    address from the port it no longer serves on (targetPort changed) goes."""
    n = node(tmp_path)
    put(n, "dns", dns(POD_A))
    ok(n.sync())
    n.kernel.conntrack.add_flow(DNS, (POD_A, 5300))  # the Service's old targetPort
    n.kernel.conntrack.add_flow(DNS, (POD_A, 5353))
    put(n, "dns", dns(POD_A, POD_B))
    ok(n.sync())
    assert n.kernel.conntrack.flows == {DNS: [(POD_A, 5353)]}


def test_a_flush_deletes_at_most_its_bound_and_goes_on_at_the_next_sync(tmp_path: Path) -> None:
    """A sync deletes at most ``bounds.deleted`` entries (the sync lock is held): the rest
    go at the next syncs, due at once, and each run says what it left."""
    n = node(tmp_path)
    n.kernel.conntrack.bounds = Bounds(examined=1_000_000, deleted=3)
    put(n, "dns", dns(POD_A, POD_B))
    ok(n.sync())
    for _ in range(7):
        n.kernel.conntrack.add_flow(DNS, (POD_B, 5353))
    n.kernel.conntrack.add_flow(DNS, (POD_A, 5353))
    put(n, "dns", dns(POD_A))
    first = ok(n.sync())
    assert [(r.deleted, r.unfinished) for r in first.conntrack] == [(3, 1)]
    assert n.dp.next_retry() == n.now[0]  # the rest is due at once
    assert [(r.deleted, r.unfinished) for r in ok(n.sync()).conntrack] == [(3, 1)]
    assert [(r.deleted, r.unfinished) for r in ok(n.sync()).conntrack] == [(1, 0)]
    assert n.kernel.conntrack.flows == {DNS: [(POD_A, 5353)]}
    assert n.dp.next_retry() is None
    assert ok(n.sync()).conntrack == []


def test_a_flush_reads_at_most_its_bound_then_leaves_the_other_services_to_the_next_sync(
    tmp_path: Path,
) -> None:
    """Entries read are bounded too: once a sync has read ``bounds.examined`` entries, the
    virtual servers it has not begun wait for the next sync; one begun is read to its end (so
    every sync finishes at least one, and a cleanup always ends)."""
    n = node(tmp_path)
    n.kernel.conntrack.bounds = Bounds(examined=4, deleted=1_000)
    keys = [ServiceKey(f"10.96.1.{i + 1}", UDP, 53) for i in range(3)]
    for i in range(3):
        put(n, f"dns{i}", udp(f"dns{i}", keys[i].address, POD_A, POD_B))
    ok(n.sync())
    for key in keys:
        for _ in range(5):
            n.kernel.conntrack.add_flow(key, (POD_B, 5353))
    for i in range(3):
        put(n, f"dns{i}", udp(f"dns{i}", keys[i].address, POD_A))
    runs = [ok(n.sync()).conntrack for _ in range(3)]
    assert [[(r.deleted, r.unfinished) for r in run] for run in runs] == [
        [(5, 2)],
        [(5, 1)],
        [(5, 0)],
    ]
    assert n.kernel.conntrack.flows == {key: [] for key in keys}


def dual_dns(*pods: tuple[str, str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A dual-stack UDP Service; ``pods``: (IPv4, IPv6) address pairs."""
    svc, (sl4,) = udp("dns", DNS.address, *(v4 for v4, _ in pods))
    svc["spec"]["clusterIPs"] = [DNS.address, DNS6.address]
    svc["spec"]["ipFamilies"] = ["IPv4", "IPv6"]
    sl6 = {**udp("dns", DNS.address, *(v6 for _, v6 in pods))[1][0], "addressType": "IPv6"}
    sl6["metadata"] = {**sl6["metadata"], "name": "dns-v6"}
    return svc, [sl4, sl6]


DNS6 = ServiceKey("fd00:10:96::35", UDP, 53)


def test_each_familys_stale_udp_flush_is_timed_and_counted(tmp_path: Path) -> None:
    """Upstream's CleanStaleEntries observes its time and adds the entries it deleted per
    family (kubeproxy_conntrack_reconciler_*): each family's flush is one run."""
    n = node(tmp_path, plan_config=PlanConfig(families=(4, 6)))
    b6 = "fd00:10:244:2::b"
    put(n, "dns", dual_dns((POD_A, "fd00:10:244:1::a"), (POD_B, b6)))
    result = ok(n.sync())
    assert [(run.family, run.deleted) for run in result.conntrack] == [(4, 0), (6, 0)]
    for key, pod in ((DNS, POD_B), (DNS, POD_B), (DNS6, b6)):
        n.kernel.conntrack.add_flow(key, (pod, 5353))
    put(n, "dns", dual_dns((POD_A, "fd00:10:244:1::a")))
    result = ok(n.sync())
    assert [(run.family, run.deleted) for run in result.conntrack] == [(4, 2), (6, 1)]
    assert all(run.seconds >= 0 for run in result.conntrack)
    assert ok(n.sync()).conntrack == []  # nothing changed: no run


def test_a_failed_conntrack_read_fails_each_service_it_was_for_and_is_retried(
    tmp_path: Path,
) -> None:
    n = node(tmp_path)
    ok(n.sync())
    k = n.kernel

    def refused(_targets: Any) -> Any:
        raise Boom("NetlinkError(1, 'Operation not permitted')")

    real = k.conntrack.flush_stale
    k.conntrack.flush_stale = refused  # type: ignore[method-assign,assignment]
    put(n, "web", web(POD_A, POD_B))
    put(n, "dns0", udp("dns0", "10.96.1.1", POD_A))
    put(n, "dns1", udp("dns1", "10.96.1.2", POD_B))
    result = n.sync()
    assert sorted(result.failed) == ["default/dns0", "default/dns1"], result.failed
    assert "Operation not permitted" in result.failed["default/dns0"]
    k.conntrack.flush_stale = real  # type: ignore[method-assign]
    n.now[0] += 1.0
    ok(n.sync())
    assert n.dp.failed == {}
    assert {f[0].address for f in k.conntrack.flushes} == {"10.96.1.1", "10.96.1.2"}


# -- foreign state -----------------------------------------------------------------------------

FOREIGN_VS = VirtualServer(ServiceKey("10.96.200.1", TCP, 80))
FOREIGN_NODE_PORT = VirtualServer(ServiceKey(NODE_IP, TCP, 31999))


def _with_foreign_state() -> FakeBackends:
    k = fake_backends()
    k.ipvs.add_virtual_server(FOREIGN_VS, RealServer(DestKey(POD_A, 8080)))
    k.ipvs.add_virtual_server(FOREIGN_NODE_PORT)
    k.ipsets.add_set("FOREIGN-SET", "hash:ip", ["192.0.2.1"])
    k.addresses.add_device("eth0", NODE_IP)
    k.iptables.run("nat", "-N FOREIGN-CHAIN")
    k.iptables.run("nat", "-A FOREIGN-CHAIN -j RETURN")
    k.iptables.run("filter", "-I INPUT 1 -s 192.0.2.99 -j DROP")
    k.iptables.run("filter", "-A INPUT -m set --match-set FOREIGN-SET src -j DROP")
    return k


def foreign(k: FakeBackends) -> dict[str, Any]:
    """What of the fake kernel is not ipvsproxy's."""
    table = holds(k)
    return {
        "ipvs": {vs: d for vs, d in table["ipvs"].items() if "10.96.200.1" in vs or "31999" in vs},
        "sets": {n: m for n, m in table["sets"].items() if n not in ipset_specs.NAMES},
        "devices": {n: a for n, a in table["devices"].items() if n != "kube-ipvs0"},
        "nat": k.iptables.tables["nat"]["FOREIGN-CHAIN"],
        "input": [r for r in k.iptables.tables["filter"]["INPUT"] if "KUBE" not in r],
    }


def test_foreign_state_is_untouched_by_sync_reconcile_and_cleanup(tmp_path: Path) -> None:
    kernel = _with_foreign_state()
    before = foreign(kernel)
    n = node(tmp_path, kernel)

    def deleted() -> SyncResult:
        put(n, "web", None)
        put(n, "np", None)
        return n.sync()

    steps: list[tuple[str, Callable[[], SyncResult]]] = [
        ("sync", n.sync),
        ("reconcile", n.reconcile),
        ("Services deleted", deleted),
        ("reconcile again", n.reconcile),
    ]
    put(n, "web", web(POD_A))
    put(n, "np", node_port("np", "10.96.0.30", 30080, POD_B))
    for step, run in steps:
        ok(run())
        assert foreign(kernel) == before, step
    put(n, "web", web(POD_A))
    ok(n.sync())
    ok(n.dp.cleanup())
    assert foreign(kernel) == before
    # And nothing of ipvsproxy's is left.
    after = holds(kernel)
    assert after["ipvs"].keys() == {f"{FOREIGN_VS.key} rr", f"{FOREIGN_NODE_PORT.key} rr"}
    assert set(after["sets"]) == {"FOREIGN-SET"}
    assert "kube-ipvs0" not in after["devices"]
    assert "KUBE-" not in after["rules"]["nat"] + after["rules"]["filter"]


# -- a refused operation amid a batch --------------------------------------------------------

BAD = "10.96.0.20"


def bad() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return service("bad", BAD), [endpoint_slice("bad", [endpoint(POD_C)])]


def _refuse_real_server(k: FakeBackends) -> None:
    k.ipvs.refuse(errno.ENOMEM, lambda op: isinstance(op, DestOp) and op.service.address == BAD)


def _refuse_virtual_server(k: FakeBackends) -> None:
    k.ipvs.refuse(errno.ENOMEM, lambda op: isinstance(op, ServiceOp) and BAD in str(op))


def _refuse_address(k: FakeBackends) -> None:
    k.addresses.refuse(errno.ENOSPC, lambda op: op == AddressOp(OpKind.ADD, BAD))


def _refuse_member(k: FakeBackends) -> None:
    k.ipsets.refuse(4353, lambda op: isinstance(op, MemberOp) and op.entry.startswith(BAD))


# How the kernel refuses one operation of the bad Service, and what the refusal says.
REFUSED: dict[str, tuple[Callable[[FakeBackends], None], str]] = {
    "its real server": (_refuse_real_server, "Cannot allocate memory"),
    "its virtual server": (_refuse_virtual_server, "Cannot allocate memory"),
    "its address": (_refuse_address, "No space left on device"),
    "its ipset member": (_refuse_member, "set is full"),
}


def programmed(n: Node, *names: str) -> None:
    """The fake kernel holds everything the plans of ``names`` want."""
    k = n.kernel
    for name in names:
        plan = n.dp.desired.plans[f"default/{name}"]
        for key, vs in plan.virtual_servers.items():
            assert vs.same_settings(k.ipvs.virtual_servers[key]), key
            assert set(k.ipvs.real_servers[key]) == set(plan.real_servers[key]), key
        assert set(plan.bind) <= k.addresses.bound()
        for set_name, entries in plan.members.items():
            assert set(entries) <= k.ipsets.sets[set_name], set_name


@pytest.mark.parametrize("refused", sorted(REFUSED))
def test_one_refused_operation_fails_only_its_service_and_is_retried(
    tmp_path: Path, refused: str
) -> None:
    refuse, why = REFUSED[refused]
    n = node(tmp_path)
    refuse(n.kernel)
    put(n, "web", web(POD_A, POD_B))
    put(n, "bad", bad())
    put(n, "np", node_port("np", "10.96.0.30", 30080, POD_B))
    result = n.sync()
    assert list(result.failed) == ["default/bad"] and BAD in result.failed["default/bad"]
    assert len(result.errors) == 1 and why in result.errors[0]
    programmed(n, "web", "np")
    # Not due yet: the next sync leaves it; then its retry programs it (the kernel takes it
    # now), with no full sync.
    assert not n.sync().full and list(n.dp.failed) == ["default/bad"]
    n.now[0] += 1.0
    retried = ok(n.sync())
    assert not retried.full and n.dp.failed == {}
    programmed(n, "web", "bad", "np")
    assert ok(n.reconcile()).writes == 0


def test_the_nth_operation_refused_is_the_one_named(tmp_path: Path) -> None:
    n = node(tmp_path)
    n.kernel.ipvs.refuse(errno.EINVAL, lambda op: isinstance(op, DestOp), nth=2)
    put(n, "web", web(POD_A, POD_B, POD_C))
    result = n.sync()
    assert list(result.failed) == ["default/web"]
    assert f"add real server {POD_B}:8080 of {WEB}" in result.failed["default/web"]
    assert ipvs_table(n.kernel) == {f"{WEB} rr": {f"{POD_A}:8080": 1, f"{POD_C}:8080": 1}}
    assert n.kernel.ipvs.counters.failed == {"add_dest": 1}


# -- an exception from a backend ---------------------------------------------------------------


def _mentions_bad(ops: Any) -> bool:
    return any(BAD in str(op) for op in ops)


def _raise_from_ipvs(k: FakeBackends) -> None:
    k.ipvs.raise_from("apply", Boom("ipvs failed"), _mentions_bad, times=None)


def _raise_from_addresses(k: FakeBackends) -> None:
    k.addresses.raise_from("apply", Boom("addresses failed"), _mentions_bad, times=None)


def _raise_from_ipsets(k: FakeBackends) -> None:
    k.ipsets.raise_from("apply", Boom("ipsets failed"), _mentions_bad, times=None)


def _raise_from_conntrack(k: FakeBackends) -> None:
    k.conntrack.raise_from(
        "flush_stale", Boom("conntrack failed"), lambda key, *_: key.address == BAD
    )


RAISING: dict[str, Callable[[FakeBackends], None]] = {
    "ipvs": _raise_from_ipvs,
    "addresses": _raise_from_addresses,
    "ipsets": _raise_from_ipsets,
    "conntrack": _raise_from_conntrack,
}


def bad_udp(*ips: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    ports = [{"name": "dns", "port": 53, "protocol": "UDP"}]
    slice_ports = [{"name": "dns", "port": 5353, "protocol": "UDP"}]
    return service("bad", BAD, ports=ports), [
        endpoint_slice("bad", [endpoint(ip) for ip in ips], ports=slice_ports)
    ]


@pytest.mark.parametrize("backend", sorted(RAISING))
def test_an_exception_from_a_backend_fails_only_its_service_and_is_retried(
    tmp_path: Path, backend: str
) -> None:
    n = node(tmp_path)
    ok(n.sync())
    RAISING[backend](n.kernel)
    put(n, "web", web(POD_A, POD_B))
    put(n, "bad", bad_udp(POD_A, POD_C))  # UDP: its new real servers flush conntrack
    put(n, "np", node_port("np", "10.96.0.30", 30080, POD_B))
    result = n.sync()
    assert list(result.failed) == ["default/bad"], (result.failed, result.errors)
    assert f"{backend} failed" in result.failed["default/bad"]
    programmed(n, "web", "np")
    # The backend works again: the retry converges what failed.
    k = n.kernel
    for fake in (k.ipvs, k.addresses, k.ipsets, k.conntrack):
        fake.raisings.clear()
    n.now[0] += 1.0
    assert not ok(n.sync()).full and n.dp.failed == {}
    programmed(n, "web", "bad", "np")


def test_a_failing_read_is_reported_and_the_next_sync_reads_again(tmp_path: Path) -> None:
    n = node(tmp_path)
    n.kernel.ipvs.raise_from("each_service", OSError(errno.ENOBUFS, "No buffer space"))
    put(n, "web", web(POD_A))
    result = n.sync()
    assert result.full and any("reading IPVS" in e for e in result.errors), result.errors
    assert n.kernel.ipvs.virtual_servers == {}  # unread: left alone
    assert n.kernel.addresses.bound() == {WEB.address}  # the other parts are programmed
    assert ok(n.sync()).full  # read again
    programmed(n, "web")


def test_rules_that_cannot_be_written_make_an_incomplete_sync(tmp_path: Path) -> None:
    """Refused even without the rules of any Service's set (the base every node needs): no
    Service can be blamed, the sync is incomplete (tests/unit/test_rules_kernel_lacks.py has
    a refusal of one set's rules)."""
    n = node(tmp_path)
    refusal = n.kernel.iptables.refuse(errno.EINVAL, times=None)
    put(n, "web", web(POD_A))
    result = n.sync()
    assert not result.complete and any("iptables-restore" in e for e in result.errors)
    programmed(n, "web")
    assert n.kernel.iptables.restore_failures == 2  # the rules, then the base alone
    assert "KUBE-SERVICES" not in n.kernel.iptables.save("nat")
    n.kernel.iptables.refusals.remove(refusal)
    assert ok(n.sync()).complete
    assert "KUBE-SERVICES" in n.kernel.iptables.save("nat")


def test_a_restore_refused_once_is_written_in_the_same_sync(tmp_path: Path) -> None:
    """A refusal that does not come back (a transient one) fails nothing: the base, then each
    set's rules are written on their own, each accepted, and the rules end up whole."""
    n = node(tmp_path)
    n.kernel.iptables.refuse(errno.EINVAL)
    put(n, "web", web(POD_A))
    assert ok(n.sync()).complete
    assert n.kernel.iptables.restore_failures == 1
    assert f"--match-set {ipset_specs.CLUSTER_IP} dst,dst -j ACCEPT" in (
        n.kernel.iptables.save("nat")
    )
