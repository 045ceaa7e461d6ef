"""ipset members over batched netlink, against the real kernel and the ipset tool's view."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.diff import MemberOp, OpKind
from ipvsproxy.kernel.errors import ApplyError
from ipvsproxy.kernel.ipset import IPSets

pytestmark = pytest.mark.kernel

SAMPLES = {
    ipset_specs.CLUSTER_IP: ["10.96.0.10,tcp:80", "10.96.0.10,udp:53", "10.96.0.11,sctp:9000"],
    ipset_specs.LOOP_BACK: ["10.244.1.11,tcp:8080,10.244.1.11"],
    ipset_specs.LOAD_BALANCER_SOURCE_CIDR: [
        "203.0.113.5,tcp:443,192.0.2.0/24",
        "203.0.113.5,tcp:443,198.51.100.7/32",
    ],
    ipset_specs.NODE_PORT_TCP: ["30080", "32767"],
    ipset_specs.IPVS_IPS: ["10.96.0.10"],
    ipset_specs.V6[ipset_specs.CLUSTER_IP]: ["fd00:10:96::a,tcp:80", "fd00:10:96::a,sctp:9000"],
    ipset_specs.V6[ipset_specs.LOOP_BACK]: ["fd00:10:244:1::b,tcp:8080,fd00:10:244:1::b"],
    ipset_specs.V6[ipset_specs.LOAD_BALANCER_SOURCE_CIDR]: [
        "2001:db8::5,tcp:443,2001:db8:1::/48",
        "2001:db8::5,tcp:443,2001:db8:2::7/128",
    ],
    ipset_specs.V6[ipset_specs.NODE_PORT_TCP]: ["30080"],
    ipset_specs.V6[ipset_specs.IPVS_IPS]: ["fd00:10:96::a"],
}


@pytest.fixture
def ipsets() -> Iterator[IPSets]:
    backend = IPSets()
    backend.ensure(backend.read())
    try:
        yield backend
    finally:
        backend.destroy(ipset_specs.NAMES)
        backend.close()


def _header(name: str) -> dict[str, str]:
    out = subprocess.run(["ipset", "list", "-t", name], capture_output=True, text=True, check=True)
    fields = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
    header = fields["Header"].split()
    if "initval" in header:  # a hash's seed, random for each set
        i = header.index("initval")
        del header[i : i + 2]
    return {"Type": fields["Type"], "Revision": fields["Revision"], "Header": " ".join(header)}


def test_sets_are_created_as_the_ipset_tool_creates_upstreams(ipsets: IPSets) -> None:
    """Every set: its type at the newest revision the kernel has, upstream's parameters."""
    for spec in ipset_specs.SPECS:
        if spec.type == "bitmap:port":
            params = ["range", "0-65535"]
        else:
            family = "inet6" if spec.family == 6 else "inet"
            params = ["family", family, "hashsize", "1024", "maxelem", "65536"]
        probe = "IPVSPROXY-PROBE"
        subprocess.run(["ipset", "create", probe, spec.type, *params], check=True)
        try:
            assert _header(spec.name) == _header(probe), spec.name
        finally:
            subprocess.run(["ipset", "destroy", probe], check=True)


def test_creating_a_set_that_exists_is_refused_and_named(ipsets: IPSets) -> None:
    with pytest.raises(ApplyError) as exc:
        ipsets.ensure(set(), [ipset_specs.CLUSTER_IP])
    assert f"create ipset {ipset_specs.CLUSTER_IP}" in str(exc.value)


def test_members_of_every_type_round_trip(ipsets: IPSets) -> None:
    ops = [MemberOp(OpKind.ADD, name, e) for name, entries in SAMPLES.items() for e in entries]
    sends = ipsets.sock.sends  # (creating the sets sent one batch over this socket too)
    assert ipsets.apply(ops) == len(ops)
    assert ipsets.sock.sends == sends + 1
    seen = ipsets.read()
    for name, entries in SAMPLES.items():
        assert seen[name] == set(entries), name
    # The ipset tool sees the same members (it prints a /32 or /128 net without its prefix).
    out = subprocess.run(["ipset", "save"], capture_output=True, text=True, check=True).stdout
    tool: dict[str, set[str]] = {}
    for line in out.splitlines():
        parts = line.split()
        if parts[0] == "add" and parts[1] in SAMPLES:
            tool.setdefault(parts[1], set()).add(parts[2])
    fixed = {
        n: {e.removesuffix("/32").removesuffix("/128") for e in es}
        for n, es in seen.items()
        if n in SAMPLES
    }
    assert tool == fixed
    ipsets.apply([MemberOp(OpKind.DELETE, ipset_specs.CLUSTER_IP, "10.96.0.10,udp:53")])
    assert ipsets.read()[ipset_specs.CLUSTER_IP] == {"10.96.0.10,tcp:80", "10.96.0.11,sctp:9000"}


def test_refused_members_are_named_and_the_rest_applies(ipsets: IPSets) -> None:
    ipsets.apply([MemberOp(OpKind.ADD, ipset_specs.CLUSTER_IP, "10.96.0.20,tcp:80")])
    with pytest.raises(ApplyError) as exc:
        ipsets.apply(
            [
                MemberOp(OpKind.ADD, ipset_specs.CLUSTER_IP, "10.96.0.20,tcp:80"),  # exists
                MemberOp(OpKind.ADD, ipset_specs.CLUSTER_IP, "10.96.0.21,tcp:80"),
                MemberOp(OpKind.DELETE, ipset_specs.CLUSTER_IP, "10.96.0.99,tcp:80"),  # absent
            ]
        )
    assert exc.value.applied == 1
    assert exc.value.failed == {0, 2}
    text = str(exc.value)
    assert "add 10.96.0.20,tcp:80 in ipset KUBE-CLUSTER-IP: element already exists" in text
    assert "delete 10.96.0.99,tcp:80 in ipset KUBE-CLUSTER-IP" in text
    assert ipsets.read()[ipset_specs.CLUSTER_IP] == {"10.96.0.20,tcp:80", "10.96.0.21,tcp:80"}


def test_a_set_larger_than_one_dump_message_is_read_whole(ipsets: IPSets) -> None:
    """The kernel splits a large set over several list replies and names its type only in the
    first: every member of every reply is read (a reconcile at 1,000 Services re-added almost
    every member before this held)."""
    entries = {f"10.96.{i // 250}.{i % 250 + 1},tcp:{80 + i % 7}" for i in range(6000)}
    ops = [MemberOp(OpKind.ADD, ipset_specs.CLUSTER_IP, e) for e in sorted(entries)]
    assert ipsets.apply(ops) == len(ops)
    assert ipsets.read()[ipset_specs.CLUSTER_IP] == entries
    out = subprocess.run(
        ["ipset", "save", ipset_specs.CLUSTER_IP], capture_output=True, text=True
    ).stdout
    assert sum(line.startswith("add ") for line in out.splitlines()) == len(entries)
