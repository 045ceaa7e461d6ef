"""The dataplane's cache of what the kernel holds shares the desired real servers once the
kernel holds exactly them (memory: a copy per virtual server was ~9 MiB at 10,000 Services),
and copies before it changes one. Over the fake kernel (``ipvsproxy.kernel.fakes``); the
kernel itself is in tests/kernel."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ipvsproxy.core.plan import NodeFacts
from ipvsproxy.dataplane.dataplane import Dataplane
from ipvsproxy.kernel.fakes import fake_backends
from tests.unit.k8s_objects import endpoint, endpoint_slice, service

NODE = NodeFacts(
    name="node-1",
    node_ips=("192.168.56.11",),
    local_addresses=frozenset({"192.168.56.11"}),
    primary_ip="192.168.56.11",
)
PORTS = [
    {"name": "http", "port": 80, "protocol": "TCP"},
    {"name": "https", "port": 443, "protocol": "TCP"},
]
SLICE_PORTS = [
    {"name": "http", "port": 8080, "protocol": "TCP"},
    {"name": "https", "port": 8443, "protocol": "TCP"},
]


def cluster(services: int, endpoints: int) -> list[tuple[str, dict[str, Any], list[str]]]:
    """Two-port Services, every fourth a NodePort, each with its own endpoint addresses."""
    out = []
    for i in range(services):
        name = f"s{i}"
        svc = service(name, f"10.96.{i // 250}.{i % 250 + 1}", ports=[dict(p) for p in PORTS])
        if i % 4 == 0:
            svc["spec"]["type"] = "NodePort"
            for j, port in enumerate(svc["spec"]["ports"]):
                port["nodePort"] = 30000 + 2 * i + j
        out.append((name, svc, [f"10.244.{i % 200}.{10 + k}" for k in range(endpoints)]))
    return out


def ipvs_writes(dp: Dataplane, name: str, svc: dict[str, Any], ips: list[str]) -> int:
    """Update ``name`` to the endpoints ``ips`` and sync; the IPVS writes of that sync."""
    before = dp.backends.ipvs.counters.writes
    slices = [endpoint_slice(name, [endpoint(ip) for ip in ips], ports=SLICE_PORTS)]
    dp.update_service(f"default/{name}", svc, slices)
    result = dp.sync()
    assert result.errors == [] and result.failed == {}
    return dp.backends.ipvs.counters.writes - before


def shared(dp: Dataplane) -> tuple[int, int]:
    obs, want = dp.observed, dp.desired.real_servers
    assert obs is not None
    assert obs.dests.keys() == want.keys()
    return sum(obs.dests[k] is want[k] for k in want), len(want)


def test_after_a_cold_sync_every_virtual_server_shares_the_desired_mapping(
    tmp_path: Path,
) -> None:
    dp = Dataplane(NODE, fake_backends(), tmp_path / "state.json")
    for name, svc, ips in cluster(40, 3):
        slices = [endpoint_slice(name, [endpoint(ip) for ip in ips], ports=SLICE_PORTS)]
        dp.update_service(f"default/{name}", svc, slices)
    assert dp.sync().writes > 0
    same, total = shared(dp)
    assert total > 40 and same == total


def test_a_change_copies_then_shares_again_and_the_cache_stays_right(tmp_path: Path) -> None:
    kernel = fake_backends()
    dp = Dataplane(NODE, kernel, tmp_path / "state.json")
    services = cluster(40, 3)
    for name, svc, ips in services:
        slices = [endpoint_slice(name, [endpoint(ip) for ip in ips], ports=SLICE_PORTS)]
        dp.update_service(f"default/{name}", svc, slices)
    dp.sync()
    _, total = shared(dp)
    name, svc, ips = services[0]
    added = "10.244.250.1"
    before = {k: dict(v) for k, v in dp.desired.real_servers.items()}
    writes = ipvs_writes(dp, name, svc, [*ips, added])
    changed = [k for k in before if dp.desired.real_servers[k] != before[k]]
    assert changed and writes == len(changed)
    assert shared(dp) == (total, total)
    obs = dp.observed
    assert obs is not None
    for k in changed:
        assert {d.address for d in obs.dests[k]} == {*ips, added}
        assert set(kernel.ipvs.real_servers[k]) == set(obs.dests[k])
    # And removed again: each one deleted (idle). Read back to decide their drain, those
    # virtual servers hold the kernel's copies until the next full sync, which shares them.
    assert ipvs_writes(dp, name, svc, ips) == len(changed)
    for k in changed:
        assert {d.address for d in obs.dests[k]} == set(ips)
        assert set(kernel.ipvs.real_servers[k]) == set(obs.dests[k])
    assert dp.reconcile().writes == 0
    assert shared(dp) == (total, total)
