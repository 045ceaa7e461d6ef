"""The iptables rules, rendered for a few representative nodes, compared exactly with the
checked-in texts in golden/ (a change of the rules shows as a reviewed diff of those files).

After an intended change of ipvsproxy/core/ruleset.py: ``python -m tests.unit.test_ruleset_golden``
rewrites the files; review ``git diff tests/unit/golden`` before committing them.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.plan import OutFilter
from ipvsproxy.core.ruleset import RulesConfig, render
from ipvsproxy.core.virtual_servers import Protocol

GOLDEN = Path(__file__).parent / "golden"

# name: (configuration, non-empty sets, out filters)
CASES: dict[str, tuple[RulesConfig, frozenset[str], list[OutFilter]]] = {
    # A node before any Service: only the fixed rules.
    "empty-node": (RulesConfig(cluster_cidr="10.244.0.0/16"), frozenset(), []),
    # ClusterIP and NodePort Services with endpoints on this node, default settings.
    "cluster-ip-and-node-port": (
        RulesConfig(cluster_cidr="10.244.0.0/16"),
        frozenset(
            {
                ipset_specs.CLUSTER_IP,
                ipset_specs.LOOP_BACK,
                ipset_specs.NODE_PORT_TCP,
                ipset_specs.NODE_PORT_UDP,
                ipset_specs.NODE_PORT_SCTP,
            }
            | {ipset_specs.IPVS_IPS}
        ),
        [],
    ),
    # Every set, externalTrafficPolicy Local, source ranges that leave this node out.
    "every-set-node-cidr": (
        RulesConfig(detect_local="NodeCIDR", local_value="10.244.1.0/24"),
        frozenset(ipset_specs.NAMES),
        [
            OutFilter("203.0.113.5", Protocol.TCP, 443),
            OutFilter("203.0.113.6", Protocol.UDP, 53),
        ],
    ),
    # masqueradeAll, another mark bit, no --random-fully, no local detector.
    "masquerade-all": (
        RulesConfig(masquerade_all=True, masquerade_bit=5, random_fully=False),
        frozenset(
            {
                ipset_specs.CLUSTER_IP,
                ipset_specs.EXTERNAL_IP,
                ipset_specs.LOAD_BALANCER,
                ipset_specs.IPVS_IPS,
            }
        ),
        [],
    ),
    # No local detector at all: pods are told apart by the set's src,dst match, and only the
    # node itself reaches an eTP Local address without a local endpoint.
    "no-local-detector": (
        RulesConfig(),
        frozenset(
            {
                ipset_specs.CLUSTER_IP,
                ipset_specs.EXTERNAL_IP_LOCAL,
                ipset_specs.HEALTH_CHECK_NODE_PORT,
                ipset_specs.IPVS_IPS,
            }
            | {ipset_specs.NO_LOCAL_ENDPOINTS}
        ),
        [],
    ),
}


def rendered(name: str) -> str:
    cfg, sets, out_filters = CASES[name]
    return render(cfg, sets, out_filters)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_rules_are_exactly_the_golden_text(name: str) -> None:
    want = (GOLDEN / f"rules-{name}.txt").read_text()
    got = rendered(name)
    diff = "".join(
        difflib.unified_diff(
            want.splitlines(keepends=True), got.splitlines(keepends=True), "golden", "rendered"
        )
    )
    assert got == want, f"rules for {name} differ from golden/rules-{name}.txt:\n{diff}"


def test_every_golden_file_is_a_case() -> None:
    assert sorted(p.name for p in GOLDEN.glob("rules-*.txt")) == sorted(
        f"rules-{n}.txt" for n in CASES
    )


if __name__ == "__main__":
    for case in CASES:
        (GOLDEN / f"rules-{case}.txt").write_text(rendered(case))
        print(f"wrote {GOLDEN / f'rules-{case}.txt'}")
