"""The fakes (``ipvsproxy.kernel.fakes``) behave as the kernel, where the dataplane looks.

Each scenario runs twice, over the fakes and over the real backends in a lab node's namespace,
with the same assertions on what the interfaces show (virtual and real servers, ipset members,
bound addresses, missing jumps, sysctls) and on the outcome of refused operations (which ones,
with which errno, what was applied, what was counted). A change of the kernel's behaviour, or
of a fake's, fails one side. The last test runs one dataplane story on both and compares the
tables and the writes at every step.
"""

from __future__ import annotations

import errno
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.diff import AddressOp, DestOp, MemberOp, OpKind, ServiceOp
from ipvsproxy.core.plan import NodeFacts
from ipvsproxy.core.ruleset import JUMPS, RulesConfig, render
from ipvsproxy.core.virtual_servers import (
    FWD_MASQ,
    IDLE,
    SVC_F_HASHED,
    SVC_F_PERSISTENT,
    DestKey,
    ObservedDest,
    Protocol,
    RealServer,
    ServiceKey,
    VirtualServer,
)
from ipvsproxy.dataplane.dataplane import Dataplane
from ipvsproxy.kernel.backends import Backends
from ipvsproxy.kernel.errors import ApplyError
from ipvsproxy.kernel.fakes import FakeBackends, fake_backends
from ipvsproxy.kernel.sysctl import HASHSIZE, required
from lab.net import netns
from lab.net.node_dataplane import CLUSTER_CIDR, node_dataplane, sh
from lab.net.topology import Cluster, Node
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

pytestmark = pytest.mark.kernel

T = TypeVar("T")
ADD, SET, DELETE = OpKind.ADD, OpKind.SET, OpKind.DELETE
TCP, UDP = Protocol.TCP, Protocol.UDP
NODE = "node-3"
POD, POD2 = "10.244.3.11", "10.244.3.12"
FOREIGN_SET = "FOREIGN-SET"


@dataclass
class Side:
    """One kernel, fake or real, and how to run code against it."""

    name: str
    backends: Backends
    node: Node
    fake: FakeBackends | None  # None: the lab node's kernel
    cluster: Cluster

    def run(self, fn: Callable[[], T]) -> T:
        """``fn`` with this thread in the node's namespace (the real kernel's)."""
        with netns.entered(None if self.fake else self.node.netns):
            return fn()

    def raises(self, fn: Callable[[], object]) -> ApplyError:
        with pytest.raises(ApplyError) as exc:
            self.run(fn)
        return exc.value

    def add_foreign_set(self) -> None:
        if self.fake is not None:
            self.fake.ipsets.add_set(FOREIGN_SET, "hash:ip", ["192.0.2.1"])
        else:
            self.sh(f"ipset create {FOREIGN_SET} hash:ip && ipset add {FOREIGN_SET} 192.0.2.1")

    def set_names(self) -> set[str]:
        """Every set on the node, ours or not."""
        if self.fake is not None:
            return set(self.fake.ipsets.sets)
        return set(self.sh("ipset list -n").split())

    def sh(self, cmd: str, check: bool = True) -> str:
        return sh(self.cluster, self.node.netns, cmd, check=check)


def _clean(side: Side) -> None:
    """Nothing of these tests left on the node."""
    side.run(side.backends.iptables.remove)
    names = " ".join(sorted(ipset_specs.NAMES | {FOREIGN_SET}))
    side.sh(
        f"ipvsadm -C; for s in {names}; do ipset destroy $s 2>/dev/null; done;"
        " ip link del kube-ipvs0 2>/dev/null; true"
    )


@pytest.fixture(params=["fake", "real"])
def side(request: pytest.FixtureRequest, lab_cluster: Cluster) -> Iterator[Side]:
    node = lab_cluster.node(NODE)
    if request.param == "fake":
        kernel = fake_backends()
        kernel.addresses.add_device("eth0", node.ip)
        kernel.addresses.add_device("cni0", node.gateway)
        yield Side("fake", kernel, node, kernel, lab_cluster)
        return
    with netns.entered(node.netns):
        backends = Backends.open()
    real = Side("real", backends, node, None, lab_cluster)
    _clean(real)
    try:
        yield real
    finally:
        _clean(real)
        backends.close()


# -- IPVS ----------------------------------------------------------------------------------------

WEB = VirtualServer(ServiceKey("10.96.50.1", TCP, 80), "rr")
STICKY = VirtualServer(ServiceKey("10.96.50.2", TCP, 443), "sh", SVC_F_PERSISTENT, 10800)
DNS = VirtualServer(ServiceKey("10.96.50.1", UDP, 53), "wrr")
MISSING = ServiceKey("10.96.50.9", TCP, 80)


def test_ipvs_reads_back_what_was_written(side: Side) -> None:
    ipvs = side.backends.ipvs
    ops: list[ServiceOp | DestOp] = [ServiceOp(ADD, vs) for vs in (WEB, STICKY, DNS)]
    ops += [
        DestOp(ADD, WEB.key, DestKey(POD, 8080)),
        DestOp(ADD, WEB.key, RealServer(DestKey(POD2, 8080), weight=0)),
        DestOp(ADD, DNS.key, RealServer(DestKey(POD, 5353), weight=3)),
    ]
    assert side.run(lambda: ipvs.apply(ops)) == len(ops)
    # As the kernel reports them: hashed, the netmask as a prefix length.
    assert side.run(ipvs.services) == {
        WEB.key: VirtualServer(WEB.key, "rr", SVC_F_HASHED, 0, 32),
        STICKY.key: VirtualServer(STICKY.key, "sh", SVC_F_PERSISTENT | SVC_F_HASHED, 10800, 32),
        DNS.key: VirtualServer(DNS.key, "wrr", SVC_F_HASHED, 0, 32),
    }
    assert sorted(vs.key for vs in side.run(lambda: list(ipvs.each_service()))) == sorted(
        [WEB.key, STICKY.key, DNS.key]
    )
    assert side.run(lambda: ipvs.dests(WEB.key)) == {
        DestKey(POD, 8080): ObservedDest(RealServer(DestKey(POD, 8080), 1, FWD_MASQ), IDLE),
        DestKey(POD2, 8080): ObservedDest(RealServer(DestKey(POD2, 8080), 0, FWD_MASQ), IDLE),
    }
    assert side.run(lambda: ipvs.dests(STICKY.key)) == {}
    assert side.run(lambda: ipvs.dests(MISSING)) == {}
    traffic = side.run(ipvs.services_with_traffic)
    assert {k: vs for k, (vs, _) in traffic.items()} == side.run(ipvs.services)
    assert set(side.run(lambda: ipvs.dests_with_traffic(WEB.key))) == {
        DestKey(POD, 8080),
        DestKey(POD2, 8080),
    }
    # Changed, then deleted (a virtual server with its real servers).
    changes: list[ServiceOp | DestOp] = [
        ServiceOp(SET, VirtualServer(WEB.key, "lc")),
        DestOp(SET, WEB.key, RealServer(DestKey(POD2, 8080), weight=2)),
        DestOp(DELETE, WEB.key, DestKey(POD, 8080)),
        ServiceOp(DELETE, DNS),
    ]
    assert side.run(lambda: ipvs.apply(changes)) == len(changes)
    services = side.run(ipvs.services)
    assert set(services) == {WEB.key, STICKY.key} and services[WEB.key].scheduler == "lc"
    assert {d: s.server.weight for d, s in side.run(lambda: ipvs.dests(WEB.key)).items()} == {
        DestKey(POD2, 8080): 2
    }
    assert side.run(lambda: ipvs.dests(DNS.key)) == {}
    assert ipvs.counters.ok == {
        "add_service": 3,
        "add_dest": 3,
        "set_service": 1,
        "set_dest": 1,
        "delete_dest": 1,
        "delete_service": 1,
    }
    assert ipvs.counters.failed == {}


# Each refused in one batch (between two accepted operations), with the kernel's errno.
IPVS_REFUSALS: list[tuple[str, ServiceOp | DestOp, int]] = [
    ("a virtual server that exists", ServiceOp(ADD, WEB), errno.EEXIST),
    (
        "a scheduler the kernel lacks",
        ServiceOp(ADD, VirtualServer(ServiceKey("10.96.50.3", TCP, 80), "nosuch")),
        errno.ENOENT,
    ),
    ("changing a missing virtual server", ServiceOp(SET, VirtualServer(MISSING)), errno.ESRCH),
    ("deleting a missing virtual server", ServiceOp(DELETE, VirtualServer(MISSING)), errno.ESRCH),
    ("a real server of a missing one", DestOp(ADD, MISSING, DestKey(POD, 80)), errno.ESRCH),
    ("a real server that exists", DestOp(ADD, WEB.key, DestKey(POD, 8080)), errno.EEXIST),
    (
        "changing a missing real server",
        DestOp(SET, WEB.key, RealServer(DestKey(POD2, 8080))),
        errno.ENOENT,
    ),
    ("deleting a missing real server", DestOp(DELETE, WEB.key, DestKey(POD2, 8080)), errno.ENOENT),
    ("a multicast real server", DestOp(ADD, WEB.key, DestKey("224.0.0.5", 80)), errno.EINVAL),
    ("the broadcast address", DestOp(ADD, WEB.key, DestKey("255.255.255.255", 80)), errno.EINVAL),
    ("a real server in 0.0.0.0/8", DestOp(ADD, WEB.key, DestKey("0.0.0.0", 80)), errno.EINVAL),
]


def test_ipvs_refuses_what_the_kernel_refuses_and_applies_the_rest(side: Side) -> None:
    ipvs = side.backends.ipvs
    side.run(lambda: ipvs.apply([ServiceOp(ADD, WEB), DestOp(ADD, WEB.key, DestKey(POD, 8080))]))
    first = DestOp(ADD, WEB.key, DestKey(POD, 8081))
    last = DestOp(ADD, WEB.key, DestKey(POD, 0))  # port 0 is taken
    ops = [first, *(op for _, op, _ in IPVS_REFUSALS), last]
    err = side.raises(lambda: ipvs.apply(ops))
    got = {what: 0 for what, _, _ in IPVS_REFUSALS}
    for i, r in zip(sorted(err.failed), err.rejected, strict=True):
        assert r.what == str(ops[i])
        got[IPVS_REFUSALS[i - 1][0]] = r.errno
    assert got == {what: code for what, _, code in IPVS_REFUSALS}
    assert (err.applied, err.failed) == (2, frozenset(range(1, len(ops) - 1)))
    assert side.run(ipvs.services).keys() == {WEB.key}
    assert set(side.run(lambda: ipvs.dests(WEB.key))) == {
        DestKey(POD, 8080),
        DestKey(POD, 8081),
        DestKey(POD, 0),
    }
    assert ipvs.counters.failed == {
        "add_service": 2,
        "set_service": 1,
        "delete_service": 1,
        "add_dest": 5,
        "set_dest": 1,
        "delete_dest": 1,
    }


# -- ipsets --------------------------------------------------------------------------------------

CLUSTER_IP, SOURCE_CIDR = ipset_specs.CLUSTER_IP, ipset_specs.LOAD_BALANCER_SOURCE_CIDR
NODE_PORT_TCP, NODE_PORT_UDP = ipset_specs.NODE_PORT_TCP, ipset_specs.NODE_PORT_UDP


def test_ipsets_hold_members_as_the_kernel_does(side: Side) -> None:
    ipsets = side.backends.ipsets
    side.add_foreign_set()
    made = [CLUSTER_IP, SOURCE_CIDR, NODE_PORT_TCP]
    assert side.run(lambda: ipsets.ensure(set(), made)) == 3
    assert side.run(ipsets.read) == {name: set() for name in made}  # not the foreign one
    adds = [
        MemberOp(ADD, CLUSTER_IP, "10.96.50.1,tcp:80"),
        MemberOp(ADD, CLUSTER_IP, "10.96.50.1,udp:53"),
        MemberOp(ADD, SOURCE_CIDR, "203.0.113.5,tcp:443,198.51.100.7"),  # no prefix: /32
        MemberOp(ADD, SOURCE_CIDR, "203.0.113.5,tcp:443,192.0.2.5/24"),  # host bits: cleared
        MemberOp(ADD, NODE_PORT_TCP, "30080"),
    ]
    assert side.run(lambda: ipsets.apply(adds)) == len(adds)
    held = {
        CLUSTER_IP: {"10.96.50.1,tcp:80", "10.96.50.1,udp:53"},
        SOURCE_CIDR: {"203.0.113.5,tcp:443,198.51.100.7/32", "203.0.113.5,tcp:443,192.0.2.0/24"},
        NODE_PORT_TCP: {"30080"},
    }
    assert side.run(ipsets.read) == held
    parts: dict[str, set[str]] = {}
    for name, entries in side.run(lambda: list(ipsets.each_part())):
        parts.setdefault(name, set()).update(entries)
    assert parts == held
    # The same entry written another way is the one held: it goes.
    same = MemberOp(DELETE, SOURCE_CIDR, "203.0.113.5,tcp:443,198.51.100.7/32")
    assert side.run(lambda: ipsets.apply([same])) == 1
    assert ipsets.counters.ok == {"set": 3, "add_member": 5, "delete_member": 1}


IPSET_REFUSALS: list[tuple[str, MemberOp, int]] = [
    ("an entry that exists", MemberOp(ADD, CLUSTER_IP, "10.96.50.1,tcp:80"), 4103),
    ("deleting a missing entry", MemberOp(DELETE, CLUSTER_IP, "10.96.50.2,tcp:80"), 4103),
    ("a /0 net", MemberOp(ADD, SOURCE_CIDR, "203.0.113.5,tcp:443,0.0.0.0/0"), 4104),
    ("a set that does not exist", MemberOp(ADD, NODE_PORT_UDP, "30053"), errno.ENOENT),
]


def test_ipsets_refuse_what_the_kernel_refuses_and_apply_the_rest(side: Side) -> None:
    ipsets = side.backends.ipsets
    side.run(lambda: ipsets.ensure(set(), [CLUSTER_IP, SOURCE_CIDR]))
    side.run(lambda: ipsets.apply([MemberOp(ADD, CLUSTER_IP, "10.96.50.1,tcp:80")]))
    first = MemberOp(ADD, CLUSTER_IP, "10.96.50.3,tcp:80")
    last = MemberOp(ADD, SOURCE_CIDR, "203.0.113.5,tcp:443,10.0.0.0/8")
    ops = [first, *(op for _, op, _ in IPSET_REFUSALS), last]
    err = side.raises(lambda: ipsets.apply(ops))
    got = {what: 0 for what, _, _ in IPSET_REFUSALS}
    for i, r in zip(sorted(err.failed), err.rejected, strict=True):
        assert r.what.startswith(f"{ops[i]}: ")
        got[IPSET_REFUSALS[i - 1][0]] = r.errno
    assert got == {what: code for what, _, code in IPSET_REFUSALS}
    assert (err.applied, err.failed) == (2, frozenset(range(1, len(ops) - 1)))
    assert side.run(ipsets.read) == {
        CLUSTER_IP: {"10.96.50.1,tcp:80", "10.96.50.3,tcp:80"},
        SOURCE_CIDR: {"203.0.113.5,tcp:443,10.0.0.0/8"},
    }
    # Creating a set that exists, and destroying one that does not, are refused too.
    exists = side.raises(lambda: ipsets.ensure(set(), [CLUSTER_IP]))
    assert exists.rejected[0].what.startswith(f"create ipset {CLUSTER_IP}")
    assert exists.rejected[0].errno == errno.EEXIST
    missing = side.raises(lambda: ipsets.destroy([NODE_PORT_UDP]))
    assert missing.rejected[0].what.startswith(f"destroy ipset {NODE_PORT_UDP}")
    assert missing.rejected[0].errno == errno.ENOENT


def test_ipsets_destroy_only_ours(side: Side) -> None:
    ipsets = side.backends.ipsets
    side.add_foreign_set()
    side.run(lambda: ipsets.ensure(set(), [CLUSTER_IP]))
    side.run(lambda: ipsets.apply([MemberOp(ADD, CLUSTER_IP, "10.96.50.1,tcp:80")]))
    side.run(lambda: ipsets.destroy([CLUSTER_IP, FOREIGN_SET]))
    assert side.run(ipsets.read) == {}
    assert FOREIGN_SET in side.set_names() and CLUSTER_IP not in side.set_names()


# -- addresses -----------------------------------------------------------------------------------


def test_addresses_on_kube_ipvs0(side: Side) -> None:
    addresses = side.backends.addresses
    node = side.node
    assert side.run(addresses.bound) == set() and side.run(addresses.device_index) is None
    ipv4 = {a for _, a in side.run(addresses.indexed) if ":" not in a}
    assert ipv4 == {"127.0.0.1", node.ip, node.gateway}
    binds = [AddressOp(ADD, "10.96.50.1"), AddressOp(ADD, "10.96.50.2")]
    assert side.run(lambda: addresses.apply(binds)) == 2
    index = side.run(addresses.device_index)
    assert index is not None
    assert side.run(addresses.bound) == {"10.96.50.1", "10.96.50.2"}
    on_device = {a for i, a in side.run(addresses.indexed) if i == index}
    assert on_device == {"10.96.50.1", "10.96.50.2"}
    refused = [
        AddressOp(ADD, "10.96.50.1"),  # bound
        AddressOp(ADD, "10.96.50.3"),
        AddressOp(DELETE, "10.96.50.4"),  # not bound
        AddressOp(DELETE, "10.96.50.2"),
    ]
    err = side.raises(lambda: addresses.apply(refused))
    assert (err.applied, err.failed) == (2, frozenset({0, 2}))
    assert [(r.what, r.errno) for r in err.rejected] == [
        ("add address 10.96.50.1 on kube-ipvs0", errno.EEXIST),
        ("delete address 10.96.50.4 on kube-ipvs0", errno.EADDRNOTAVAIL),
    ]
    assert side.run(addresses.bound) == {"10.96.50.1", "10.96.50.3"}
    side.run(addresses.remove_device)
    side.run(addresses.remove_device)  # gone: nothing to do
    assert side.run(addresses.bound) == set() and side.run(addresses.device_index) is None
    assert addresses.counters.ok == {
        "add_device": 1,
        "add_address": 3,
        "delete_address": 1,
        "delete_device": 1,
    }
    assert addresses.counters.failed == {"add_address": 1, "delete_address": 1}


# -- iptables ------------------------------------------------------------------------------------


def test_rules_are_restored_with_their_jumps_and_removed(side: Side) -> None:
    iptables, ipsets = side.backends.iptables, side.backends.ipsets
    side.run(lambda: ipsets.ensure(set(), ipset_specs.UPSTREAM_NAMES))
    text = render(RulesConfig(cluster_cidr=CLUSTER_CIDR), frozenset(), ())
    assert side.run(iptables.read).missing_jumps == JUMPS
    assert side.run(iptables.missing_jumps_checked) == JUMPS
    side.run(lambda: iptables.apply(text, JUMPS))
    written = side.run(iptables.read)
    assert written.missing_jumps == () and side.run(iptables.missing_jumps_checked) == ()
    # Written again with every jump in place: the same chains, no jump twice.
    side.run(lambda: iptables.apply(text))
    assert side.run(iptables.read) == written
    # A set a rule matches cannot be destroyed.
    busy = side.raises(lambda: ipsets.destroy([ipset_specs.CLUSTER_IP]))
    assert busy.rejected[0].errno == 4100, busy  # "set is in use"
    # A restore that names a set that does not exist is refused whole.
    bad = text.replace("KUBE-CLUSTER-IP", "KUBE-NO-SUCH-SET")
    refused = side.raises(lambda: iptables.apply(bad))
    assert refused.rejected[0].what.startswith("iptables-restore")
    assert side.run(iptables.read) == written
    assert iptables.restore_failures == 1
    assert (iptables.counters.ok, iptables.counters.failed) == ({"restore": 2}, {"restore": 1})
    side.run(iptables.remove)
    assert side.run(iptables.read).missing_jumps == JUMPS
    side.run(iptables.remove)  # nothing left: nothing to do
    side.run(lambda: ipsets.destroy(ipset_specs.UPSTREAM_NAMES))
    assert side.run(ipsets.read) == {}


# -- sysctls -------------------------------------------------------------------------------------


def test_sysctls_are_written_when_they_differ(side: Side) -> None:
    sysctls = side.backends.sysctls
    want = required(strict_arp=True)
    before = side.run(lambda: sysctls.read(want))
    try:
        written = side.run(lambda: sysctls.ensure(want))
        assert written == [n for n in want if before[n] != want[n]]
        assert side.run(lambda: sysctls.read(want)) == want
        assert side.run(lambda: sysctls.ensure(want)) == []
        assert sysctls.counters.ok == ({"sysctl": len(written)} if written else {})
        with pytest.raises(OSError):
            side.run(lambda: sysctls.read({"net/ipv4/vs/no_such_setting": "1"}))
    finally:
        side.run(lambda: sysctls.ensure(before))


def test_conntrack_limits_are_raised_never_lowered(side: Side) -> None:
    """Limits at or above their floor are left (also the read-only nf_conntrack_max of a
    network namespace, and the hash size); one below its floor that cannot be written raises
    OSError, the kernel's value kept."""
    sysctls = side.backends.sysctls
    limits = {"net/netfilter/nf_conntrack_max": 0, HASHSIZE: 0}
    now = {n: int(v) for n, v in side.run(lambda: sysctls.read(limits)).items()}
    assert side.run(lambda: sysctls.raise_to(now)) == []
    assert side.run(lambda: sysctls.raise_to({n: v // 2 for n, v in now.items()})) == []
    name = "net/netfilter/nf_conntrack_max"
    if side.fake is not None:  # read-only, as in a network namespace
        side.fake.sysctls.refuse(errno.EACCES, name.__eq__)
    with pytest.raises(OSError):
        side.run(lambda: sysctls.raise_to({name: now[name] + 1}))
    assert side.run(lambda: sysctls.read(limits)) == {n: str(v) for n, v in now.items()}
    assert sysctls.counters.ok == {}


# -- one dataplane story on both -----------------------------------------------------------------


def observed(backends: Backends) -> dict[str, Any]:
    """What the interfaces show of everything the story touches."""
    ipvs = backends.ipvs
    return {
        "ipvs": {
            key: (
                vs,
                {d: (s.server.weight, s.server.fwd_method) for d, s in ipvs.dests(key).items()},
            )
            for key, vs in ipvs.services().items()
        },
        "sets": backends.ipsets.read(),
        "bound": backends.addresses.bound(),
        "device": backends.addresses.device_index() is not None,
        "missing jumps": backends.iptables.read().missing_jumps,
    }


def test_one_dataplane_story_leaves_the_same_tables_and_writes_on_both(
    lab_cluster: Cluster, tmp_path: Path
) -> None:
    node = lab_cluster.node(NODE)
    pods = [p.ip for p in node.pods]
    udp = [{"name": "dns", "port": 53, "protocol": "UDP"}]
    udp_slice = [{"name": "dns", "port": 5353, "protocol": "UDP"}]
    node_port = [{"name": "http", "port": 80, "nodePort": 30350, "protocol": "TCP"}]

    def web(ips: list[str]) -> tuple[Any, list[Any]]:
        return service("web", "10.96.51.1"), [endpoint_slice("web", [endpoint(i) for i in ips])]

    objects: dict[str, tuple[Any, list[Any]] | None] = {
        "web": web(pods),
        "dns": (
            service("dns", "10.96.51.2", ports=udp),
            [endpoint_slice("dns", [endpoint(pods[0])], ports=udp_slice)],
        ),
        "np": (
            service(
                "np", "10.96.51.3", type="NodePort", ports=node_port, sessionAffinity="ClientIP"
            ),
            [endpoint_slice("np", [endpoint(pods[1])])],
        ),
    }
    story: list[tuple[str, dict[str, tuple[Any, list[Any]] | None], str]] = [
        ("three Services", objects, "sync"),
        ("nothing drifted", {}, "reconcile"),
        ("an endpoint gone", {"web": web(pods[:1])}, "sync"),
        ("a Service deleted", {"np": None}, "sync"),
        ("a full sync", {}, "reconcile"),
        ("cleanup", {}, "cleanup"),
    ]

    def step(dp: Dataplane, changes: dict[str, Any], how: str) -> tuple[int, list[str]]:
        for name, obj in changes.items():
            if obj is None:
                dp.update_service(f"default/{name}", None, [])
            else:
                dp.update_service(f"default/{name}", obj[0], obj[1])
        result = getattr(dp, how)()
        return result.writes, result.errors

    with node_dataplane(lab_cluster, node, tmp_path / "real.json") as real:
        fake = fake_backends()
        # The node's own sysctls: both write the same ones.
        fake.sysctls.values.update(real.run(lambda dp: dp.sysctls()))
        fake_dp = Dataplane(
            NodeFacts(
                name=node.name,
                node_ips=(node.ip,),
                local_addresses=frozenset({node.ip, node.gateway}),
                primary_ip=node.ip,
            ),
            fake,
            tmp_path / "fake.json",
            rules_config=RulesConfig(cluster_cidr=CLUSTER_CIDR),
        )
        for what, changes, how in story:
            on_real = real.run(functools.partial(step, changes=changes, how=how))
            on_fake = step(fake_dp, changes, how)
            assert on_fake == on_real, what
            assert on_real[1] == [], what
            assert observed(fake) == real.run(lambda dp: observed(real.backends)), what
