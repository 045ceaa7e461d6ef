"""The IPVS backend against the real kernel: batched writes, dumps, and errors that name the
object the kernel refused."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from ipvsproxy.core.diff import DestOp, OpKind, ServiceOp
from ipvsproxy.core.virtual_servers import (
    SVC_F_PERSISTENT,
    DestKey,
    Protocol,
    RealServer,
    ServiceKey,
    VirtualServer,
)
from ipvsproxy.kernel.errors import ApplyError
from ipvsproxy.kernel.ipvs import IPVS

pytestmark = pytest.mark.kernel


@pytest.fixture
def ipvs() -> Iterator[IPVS]:
    subprocess.run(["ipvsadm", "-C"], check=True)
    backend = IPVS()
    try:
        yield backend
    finally:
        backend.close()
        subprocess.run(["ipvsadm", "-C"], check=True)


def ipvsadm_lines() -> list[str]:
    out = subprocess.run(["ipvsadm", "-Sn"], capture_output=True, text=True, check=True).stdout
    return sorted(out.splitlines())


def test_batch_of_services_and_dests_matches_ipvsadm(ipvs: IPVS) -> None:
    tcp = VirtualServer(ServiceKey("10.96.0.10", Protocol.TCP, 80), "rr")
    udp = VirtualServer(ServiceKey("10.96.0.10", Protocol.UDP, 53), "wrr")
    sticky = VirtualServer(
        ServiceKey("10.96.0.11", Protocol.SCTP, 9000), "sh", SVC_F_PERSISTENT, 10800
    )
    ops: list[ServiceOp | DestOp] = [ServiceOp(OpKind.ADD, vs) for vs in (tcp, udp, sticky)]
    for i in range(1, 4):
        ops.append(DestOp(OpKind.ADD, tcp.key, RealServer(DestKey(f"10.244.1.{i}", 8080), 1)))
    ops.append(DestOp(OpKind.ADD, udp.key, RealServer(DestKey("10.244.2.1", 5353), 3)))
    assert ipvs.apply(ops) == len(ops)
    assert ipvs.sock.sends == 1  # one system call carried the whole batch
    assert ipvsadm_lines() == sorted(
        [
            "-A -t 10.96.0.10:80 -s rr",
            "-a -t 10.96.0.10:80 -r 10.244.1.1:8080 -m -w 1",
            "-a -t 10.96.0.10:80 -r 10.244.1.2:8080 -m -w 1",
            "-a -t 10.96.0.10:80 -r 10.244.1.3:8080 -m -w 1",
            "-A -u 10.96.0.10:53 -s wrr",
            "-a -u 10.96.0.10:53 -r 10.244.2.1:5353 -m -w 3",
            "-A --sctp-service 10.96.0.11:9000 -s sh -p 10800",
        ]
    )
    services = ipvs.services()
    assert set(services) == {tcp.key, udp.key, sticky.key}
    for vs in (tcp, udp, sticky):
        assert vs.same_settings(services[vs.key]), services[vs.key]
    dests = ipvs.dests(tcp.key)
    assert sorted(str(k) for k in dests) == [f"10.244.1.{i}:8080" for i in range(1, 4)]
    assert all(d.server.weight == 1 and d.stats.idle for d in dests.values())


def test_set_and_delete(ipvs: IPVS) -> None:
    vs = VirtualServer(ServiceKey("10.96.0.20", Protocol.TCP, 443), "rr")
    rs = RealServer(DestKey("10.244.1.9", 8443), 1)
    ipvs.apply([ServiceOp(OpKind.ADD, vs), DestOp(OpKind.ADD, vs.key, rs)])
    changed = VirtualServer(vs.key, "lc", SVC_F_PERSISTENT, 60)
    ipvs.apply(
        [
            ServiceOp(OpKind.SET, changed),
            DestOp(OpKind.SET, vs.key, RealServer(rs.key, weight=0)),
        ]
    )
    assert changed.same_settings(ipvs.services()[vs.key])
    assert ipvs.dests(vs.key)[rs.key].server.weight == 0
    ipvs.apply([DestOp(OpKind.DELETE, vs.key, rs)])
    assert ipvs.dests(vs.key) == {}
    ipvs.apply([ServiceOp(OpKind.DELETE, vs)])
    assert ipvs.services() == {}


def test_rejected_operations_are_named_and_the_rest_applied(ipvs: IPVS) -> None:
    vs = VirtualServer(ServiceKey("10.96.0.30", Protocol.TCP, 80), "rr")
    missing = ServiceKey("10.96.0.31", Protocol.TCP, 80)
    good = RealServer(DestKey("10.244.1.5", 80), 1)
    ops: list[ServiceOp | DestOp] = [
        ServiceOp(OpKind.ADD, vs),
        ServiceOp(OpKind.ADD, vs),  # already exists
        DestOp(OpKind.ADD, missing, good),  # no such virtual server
        DestOp(OpKind.ADD, vs.key, good),
        ServiceOp(OpKind.ADD, VirtualServer(ServiceKey("10.96.0.32", Protocol.TCP, 80), "nope")),
    ]
    with pytest.raises(ApplyError) as exc:
        ipvs.apply(ops)
    err = exc.value
    assert err.applied == 2
    assert [r.what for r in err.rejected] == [str(ops[1]), str(ops[2]), str(ops[4])]
    assert "10.96.0.31:80" in str(err)
    assert "10.96.0.32:80" in str(err)
    assert set(ipvs.services()) == {vs.key}
    assert set(ipvs.dests(vs.key)) == {good.key}
    assert ipvs.counters.failed == {"add_service": 2, "add_dest": 1}


def test_many_services_in_few_system_calls(ipvs: IPVS) -> None:
    ops: list[ServiceOp | DestOp] = []
    for i in range(500):
        vs = VirtualServer(ServiceKey(f"10.97.{i // 250}.{i % 250 + 1}", Protocol.TCP, 80), "rr")
        ops.append(ServiceOp(OpKind.ADD, vs))
        ops += [
            DestOp(OpKind.ADD, vs.key, RealServer(DestKey(f"10.244.3.{j}", 80), 1))
            for j in range(1, 5)
        ]
    sends, receives = ipvs.sock.sends, ipvs.sock.receives
    ipvs.apply(ops)
    assert ipvs.sock.sends - sends < len(ops) / 100
    # Only each batch's last request asks for an ack: one recv() per batch, not per request.
    assert ipvs.sock.receives - receives == ipvs.sock.sends - sends
    assert len(ipvs.services()) == 500
    assert sum(len(ipvs.dests(k)) for k in ipvs.services()) == 2000


def test_ipv6_services_and_dests_beside_ipv4_ones_match_ipvsadm(ipvs: IPVS) -> None:
    v4 = VirtualServer(ServiceKey("10.96.0.10", Protocol.TCP, 80), "rr")
    v6 = VirtualServer(ServiceKey("fd00:10:96::a", Protocol.TCP, 80), "rr")
    sticky = VirtualServer(
        ServiceKey("fd00:10:96::b", Protocol.UDP, 53), "rr", SVC_F_PERSISTENT, 60, 128
    )
    ops: list[ServiceOp | DestOp] = [ServiceOp(OpKind.ADD, vs) for vs in (v4, v6, sticky)]
    ops.append(DestOp(OpKind.ADD, v4.key, RealServer(DestKey("10.244.1.1", 8080), 1)))
    for i in (1, 2):
        ops.append(DestOp(OpKind.ADD, v6.key, RealServer(DestKey(f"fd00:10:244:1::{i}", 8080))))
    ops.append(DestOp(OpKind.ADD, sticky.key, RealServer(DestKey("fd00:10:244:2::1", 5353))))
    assert ipvs.apply(ops) == len(ops)
    assert ipvsadm_lines() == sorted(
        [
            "-A -t 10.96.0.10:80 -s rr",
            "-a -t 10.96.0.10:80 -r 10.244.1.1:8080 -m -w 1",
            "-A -t [fd00:10:96::a]:80 -s rr",
            "-a -t [fd00:10:96::a]:80 -r [fd00:10:244:1::1]:8080 -m -w 1",
            "-a -t [fd00:10:96::a]:80 -r [fd00:10:244:1::2]:8080 -m -w 1",
            "-A -u [fd00:10:96::b]:53 -s rr -p 60",
            "-a -u [fd00:10:96::b]:53 -r [fd00:10:244:2::1]:5353 -m -w 1",
        ]
    )
    services = ipvs.services()
    assert set(services) == {v4.key, v6.key, sticky.key}
    for vs in (v4, v6, sticky):
        assert vs.same_settings(services[vs.key]), services[vs.key]
    assert services[sticky.key].prefix_len == 128
    assert sorted(str(k) for k in ipvs.dests(v6.key)) == [
        "[fd00:10:244:1::1]:8080",
        "[fd00:10:244:1::2]:8080",
    ]
    ipvs.apply([ServiceOp(OpKind.DELETE, v6)])
    assert set(ipvs.services()) == {v4.key, sticky.key}
