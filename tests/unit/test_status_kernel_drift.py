"""``status --all``'s ipset and chain drift, from the daemon's document (``Dataplane``'s
``desired_sets`` and ``expected_chains``) and the fake kernel read as ``status`` reads the
real one: counted where the dataplane's full reconcile writes, named as it writes, and zero
once it has."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.core import ipset_specs
from ipvsproxy.status import view
from tests.unit.fake_node import RULES, Node, node
from tests.unit.test_dataplane_fake_kernel import DRIFT, POD_A, POD_B, node_port, ok, put, web


def kernel_drift(n: Node) -> dict[str, Any]:
    """``status --all``'s drift over ``n``: what its daemon would serve at /status/all, and
    the fake kernel's sets and tables as ``status`` reads them."""
    doc = view.daemon_document("node-1", {}, {}, {}, None, 0, {}, addresses=n.dp.desired.binds())
    doc |= view.kernel_document(n.dp.desired_sets(), n.dp.expected_chains())
    saved: dict[tuple[int, str], str | OSError] = {
        (4, t): n.kernel.iptables.save(t) for t in ("nat", "filter")
    }
    saved[(6, "nat")] = OSError("ip6tables-save: no table nat")  # not the daemon's family
    extras = view.Extras(
        frozenset(n.kernel.addresses.devices["kube-ipvs0"].addresses),
        n.kernel.ipsets.read(),
        **view.chains_read(saved),
    )
    part = view.all_json(extras, view.parse_daemon_document(doc))
    return {k: part[k]["drift"] for k in ("kubeIpvs0", "ipsets", "chains")}


NONE = {"count": 0, "operations": []}
EXPECTED = {
    "an ipset member deleted": ("ipsets", ["add 10.96.0.10,tcp:80 in ipset KUBE-CLUSTER-IP"]),
    "a member added to one of our sets": (
        "ipsets",
        ["delete 10.96.9.9,tcp:80 in ipset KUBE-CLUSTER-IP"],
    ),
    "a jump into our chains deleted": (
        "chains",
        ["insert jump PREROUTING -> KUBE-SERVICES in IPv4 nat"],
    ),
    "one of our chains flushed": ("chains", ["rewrite chain KUBE-SERVICES in IPv4 nat"]),
    "an address unbound from kube-ipvs0": ("kubeIpvs0", ["bind 10.96.0.10 to kube-ipvs0"]),
}


@pytest.mark.parametrize("drift", sorted(DRIFT))
def test_status_counts_what_the_reconcile_repairs_and_then_nothing(
    tmp_path: Path, drift: str
) -> None:
    damage, _repairs = DRIFT[drift]
    n = node(tmp_path, rules_config=RULES)
    put(n, "web", web(POD_A, POD_B))
    ok(n.sync())
    healthy = {"kubeIpvs0": NONE, "ipsets": NONE, "chains": NONE}
    assert kernel_drift(n) == healthy
    damage(n.kernel)
    part, ops = EXPECTED.get(drift, (None, []))
    seen = kernel_drift(n)
    assert {k: v for k, v in seen.items() if k != part} == {
        k: v for k, v in healthy.items() if k != part
    }
    if part is not None:
        assert seen[part] == {"count": len(ops), "operations": ops}
    ok(n.reconcile())
    assert kernel_drift(n) == healthy


def test_a_chain_whose_rendering_changed_is_drift_until_the_sync_writes_it(
    tmp_path: Path,
) -> None:
    n = node(tmp_path, rules_config=RULES)
    put(n, "web", web(POD_A))
    ok(n.sync())
    put(n, "np", node_port("np", "10.96.0.30", 30080, POD_B))  # KUBE-NODE-PORT-TCP fills
    chains = kernel_drift(n)["chains"]
    assert chains["count"] > 0
    assert "rewrite chain KUBE-NODE-PORT in IPv4 nat" in chains["operations"]
    assert "rewrite chain KUBE-MARK-MASQ in IPv4 nat" not in chains["operations"]
    ok(n.sync())
    assert kernel_drift(n)["chains"] == NONE


def test_a_restarted_daemon_knows_its_chains_after_its_first_sync_writes_nothing(
    tmp_path: Path,
) -> None:
    first = node(tmp_path, rules_config=RULES)
    put(first, "web", web(POD_A))
    ok(first.sync())
    second = node(tmp_path, first.kernel, rules_config=RULES)
    put(second, "web", web(POD_A))
    assert kernel_drift(second)["chains"]["count"] is None  # not synced: not known yet
    assert ok(second.sync()).writes == 0
    assert kernel_drift(second) == {"kubeIpvs0": NONE, "ipsets": NONE, "chains": NONE}


def test_a_missing_set_is_created_with_its_members(tmp_path: Path) -> None:
    n = node(tmp_path, rules_config=RULES)
    put(n, "web", web(POD_A))
    ok(n.sync())
    del n.kernel.ipsets.sets[ipset_specs.CLUSTER_IP]
    assert kernel_drift(n)["ipsets"]["operations"] == [
        "create ipset KUBE-CLUSTER-IP",
        "add 10.96.0.10,tcp:80 in ipset KUBE-CLUSTER-IP",
    ]
