"""The rules of both families: IPv6's rendered with the KUBE-6-* sets and its own detectors,
written through ip6tables beside IPv4's through iptables (FamilyRules)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import pytest

from ipvsproxy.core import ipset_specs, ruleset
from ipvsproxy.core.plan import OutFilter
from ipvsproxy.core.ruleset import Jump, RulesConfig
from ipvsproxy.core.virtual_servers import Protocol
from ipvsproxy.kernel.errors import ApplyError, Counters, Rejected
from ipvsproxy.kernel.iptables import FamilyRules, Observed, observe, restore_failures_by_family

V6 = ipset_specs.V6
CFG = RulesConfig(cluster_cidr="10.244.0.0/16", cluster_cidr6="fd00:10:244::/56")
SETS = frozenset(
    {ipset_specs.CLUSTER_IP, V6[ipset_specs.CLUSTER_IP], V6[ipset_specs.LOAD_BALANCER_FW]}
)
FILTERS = [
    OutFilter("203.0.113.7", Protocol.TCP, 80),
    OutFilter("2001:db8::7", Protocol.TCP, 80),
]


def test_ipv6_rules_match_the_ipv6_sets_and_detect_local_traffic_by_the_ipv6_cidr() -> None:
    v6 = ruleset.render(CFG, SETS, FILTERS, 6)
    assert "-A KUBE-SERVICES -s ::1/128 -j RETURN" in v6
    assert "--match-set KUBE-6-CLUSTER-IP dst,dst ! -s fd00:10:244::/56 -j KUBE-MARK-MASQ" in v6
    assert "--match-set KUBE-6-LOAD-BALANCER-FW dst,dst -j KUBE-SOURCE-RANGES-FIREWALL" in v6
    assert "-s 2001:db8::7 -m ipvs --vaddr 2001:db8::7" in v6
    assert "203.0.113.7" not in v6 and "10.244.0.0/16" not in v6
    assert "--match-set KUBE-CLUSTER-IP " not in v6
    v4 = ruleset.render(CFG, SETS, FILTERS, 4)
    assert "KUBE-6-" not in v4 and "2001:db8::7" not in v4
    assert "KUBE-LOAD-BALANCER-FW" not in v4


def test_ipv4_alone_renders_as_before_and_both_split_back_by_family() -> None:
    alone = ruleset.render_families(CFG, SETS, FILTERS, (4,))
    assert alone == ruleset.render(CFG, SETS, FILTERS)
    assert ruleset.split_families(alone) == {4: alone}
    both = ruleset.render_families(CFG, SETS, FILTERS, (4, 6))
    assert ruleset.split_families(both) == {
        4: ruleset.render(CFG, SETS, FILTERS, 4),
        6: ruleset.render(CFG, SETS, FILTERS, 6),
    }


def test_node_cidr_mode_uses_the_pod_cidr_of_each_family() -> None:
    cfg = RulesConfig(
        detect_local="NodeCIDR", local_value="10.244.1.0/24", local_value6="fd00:10:244:1::/64"
    )
    assert cfg.for_family(6).if_not_local() == "! -s fd00:10:244:1::/64"
    assert cfg.for_family(4).if_not_local() == "! -s 10.244.1.0/24"
    bridge = RulesConfig(detect_local="BridgeInterface", local_value="cbr0")
    assert bridge.for_family(6).if_not_local() == "! -i cbr0"


class Recorder:
    def __init__(
        self,
        refuse: bool = False,
        missing: Sequence[Jump] = (),
        chains: dict[Any, str] | None = None,
    ) -> None:
        self.chains = chains or {}
        self.counters = Counters()
        self.restore_failures = 0
        self.applied: list[tuple[str, list[Jump]]] = []
        self.refuse = refuse
        self.missing = tuple(missing)

    def read(self) -> Observed:
        return Observed(f"fp-{id(self)}", self.missing, self.chains)

    def missing_jumps_checked(self) -> tuple[Jump, ...]:
        return self.missing

    def apply(self, text: str, missing_jumps: Sequence[Jump] = ()) -> None:
        self.counters.count("restore", not self.refuse)
        if self.refuse:
            self.restore_failures += 1
            raise ApplyError([Rejected("ip6tables-restore: no", 22)], 0)
        self.applied.append((text, list(missing_jumps)))

    def remove(self) -> None:
        self.applied.append(("removed", []))


def test_family_rules_restore_each_part_with_its_familys_jumps() -> None:
    jump = ruleset.JUMPS[0]
    v4, v6 = Recorder(missing=[jump]), Recorder(missing=[jump])
    rules = FamilyRules({6: v6, 4: v4})
    seen = rules.read()
    assert [j.family for j in seen.missing_jumps] == [4, 6]
    text = ruleset.render_families(CFG, SETS, FILTERS, (4, 6))
    rules.apply(text, seen.missing_jumps)
    assert v4.applied == [(ruleset.render(CFG, SETS, FILTERS, 4), [jump])]
    ((text6, jumps6),) = v6.applied
    assert text6 == ruleset.render(CFG, SETS, FILTERS, 6)
    assert [(j.target, j.family) for j in jumps6] == [(jump.target, 6)]
    assert rules.counters.ok == {"restore": 2}


def test_family_rules_digest_each_familys_chains_under_its_family() -> None:
    """An IPTables reads one family's tables; FamilyRules names each chain by its family."""
    v4 = Recorder(chains={(4, "nat", "KUBE-SERVICES"): "d4"})
    v6 = Recorder(chains={(4, "nat", "KUBE-SERVICES"): "d6"})
    assert FamilyRules({4: v4, 6: v6}).read().chains == {
        (4, "nat", "KUBE-SERVICES"): "d4",
        (6, "nat", "KUBE-SERVICES"): "d6",
    }


def test_observe_fingerprint_is_the_digest_of_every_line_of_our_chains() -> None:
    """The state file keeps this fingerprint: the chain-by-chain digests leave it as it was."""
    nat = ":KUBE-SERVICES - [0:0]\n:OTHER - [0:0]\n-A KUBE-SERVICES -j ACCEPT\n-A OTHER -j DROP\n"
    lines = ["nat :KUBE-SERVICES - [0:0]", "nat -A KUBE-SERVICES -j ACCEPT"]
    seen = observe({"nat": nat}, family=6)
    assert seen.fingerprint == hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()
    assert seen.chains == {
        (6, "nat", "KUBE-SERVICES"): ruleset.chain_digest([line[4:] for line in lines])
    }


def test_a_family_refused_raises_after_the_other_is_written() -> None:
    v4, v6 = Recorder(), Recorder(refuse=True)
    rules = FamilyRules({4: v4, 6: v6})
    with pytest.raises(ApplyError, match="ip6tables-restore"):
        rules.apply(ruleset.render_families(CFG, SETS, FILTERS, (4, 6)))
    assert len(v4.applied) == 1
    assert rules.restore_failures == 1
    assert rules.counters.failed == {"restore": 1}
    # The metric is per family, as upstream's proxiers count theirs.
    assert restore_failures_by_family(rules) == {4: 0, 6: 1}
    assert restore_failures_by_family(v6) == {4: 1}  # a rules backend alone is IPv4's
