"""lab/faults.py: each fault is a backend wrapped behind its interface, so ipvsproxy runs
unchanged over it; here over the fake kernel (the demo shows the fault in the lab:
tests/harness/test_demo.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ipvsproxy.core.plan import NodeFacts
from ipvsproxy.dataplane.dataplane import Backends, Dataplane
from ipvsproxy.kernel.fakes import fake_backends
from lab import faults
from tests.unit.k8s_objects import endpoint, endpoint_slice, service


def test_drop_real_servers_programs_the_virtual_servers_without_their_real_servers(
    tmp_path: Path,
) -> None:
    k = fake_backends()
    broken = Backends(
        faults.DropRealServers(k.ipvs), k.addresses, k.ipsets, k.iptables, k.conntrack, k.sysctls
    )
    dp = Dataplane(NodeFacts(name="node-1"), broken, tmp_path / "state.json")
    sl = endpoint_slice("web", [endpoint("10.244.1.11"), endpoint("10.244.2.11")])
    dp.update_service("default/web", service("web", "10.96.0.10"), [sl])
    result = dp.sync()
    assert result.errors == [] and result.failed == {}
    assert {str(key) for key in k.ipvs.virtual_servers} == {"TCP 10.96.0.10:80"}
    assert all(not dests for dests in k.ipvs.real_servers.values())
    assert k.addresses.bound() == {"10.96.0.10"}  # the rest is programmed as usual


@pytest.mark.parametrize(
    "argv", [[], ["no-such-fault", "run"], ["drop-real-servers"], ["drop-real-servers", "cleanup"]]
)
def test_anything_but_a_known_fault_and_run_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert faults.main(argv) == 2
    assert "usage: python -m lab.faults NAME run" in capsys.readouterr().err
    with pytest.raises(ValueError):
        faults.backends("no-such-fault")
