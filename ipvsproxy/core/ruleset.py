"""The fixed iptables ruleset, rendered as iptables-restore text (upstream IPVS proxier's order).

Rules match ipsets, so the text depends only on configuration, on which sets are non-empty
and on the load-balancer VIPs that this node may not reach: it changes rarely, and is rewritten
only when the rendered text changes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.plan import OutFilter

NAT_CHAINS = (
    "KUBE-SERVICES",
    "KUBE-POSTROUTING",
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-MARK-MASQ",
)
FILTER_CHAINS = (
    "KUBE-FORWARD",
    "KUBE-NODE-PORT",
    "KUBE-PROXY-FIREWALL",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
)


@dataclass(frozen=True, slots=True)
class Jump:
    """A rule in a built-in chain that sends traffic into one of ours."""

    table: str
    chain: str
    comment: str
    target: str
    family: int = 4  # whose tables: iptables' (4) or ip6tables' (6)

    def spec(self) -> str:
        return f'-m comment --comment "{self.comment}" -j {self.target}'


# Upstream inserts each at position 1, in this order.
JUMPS = (
    Jump("nat", "OUTPUT", "kubernetes service portals", "KUBE-SERVICES"),
    Jump("nat", "PREROUTING", "kubernetes service portals", "KUBE-SERVICES"),
    Jump("nat", "POSTROUTING", "kubernetes postrouting rules", "KUBE-POSTROUTING"),
    Jump("filter", "FORWARD", "kubernetes forwarding rules", "KUBE-FORWARD"),
    Jump("filter", "INPUT", "kubernetes health check rules", "KUBE-NODE-PORT"),
    Jump("filter", "INPUT", "kube-proxy firewall rules", "KUBE-PROXY-FIREWALL"),
    Jump("filter", "FORWARD", "kube-proxy firewall rules", "KUBE-PROXY-FIREWALL"),
    Jump("filter", "INPUT", "kubernetes ipvs access filter", "KUBE-IPVS-FILTER"),
    Jump("filter", "OUTPUT", "kubernetes ipvs access filter", "KUBE-IPVS-OUT-FILTER"),
)


@dataclass(frozen=True, slots=True)
class RulesConfig:
    """``detect_local`` is upstream's detectLocalMode: ClusterCIDR and NodeCIDR take a CIDR in
    ``local_value``, BridgeInterface an interface name, InterfaceNamePrefix a name prefix."""

    masquerade_all: bool = False
    masquerade_bit: int = 14
    cluster_cidr: str | None = None
    random_fully: bool = True
    detect_local: str = "ClusterCIDR"
    local_value: str | None = None
    cluster_cidr6: str | None = None  # clusterCIDR's IPv6 half, for the IPv6 rules
    local_value6: str | None = None  # the NodeCIDR mode's IPv6 pod CIDR

    def for_family(self, family: int) -> RulesConfig:
        """The settings of ``family``'s rules: its cluster CIDR and pod CIDR (the interface
        detectors are the same for both)."""
        if family != 6:
            return self
        local = self.local_value
        if self.detect_local in ("ClusterCIDR", "NodeCIDR"):
            local = self.local_value6
        return replace(self, cluster_cidr=self.cluster_cidr6, local_value=local)

    @property
    def mark(self) -> str:
        return f"{1 << self.masquerade_bit:#x}"

    def if_not_local(self) -> str | None:
        """The match for traffic that does not come from a local pod (None: undetectable)."""
        mode = self.detect_local or "ClusterCIDR"
        value = self.local_value or (self.cluster_cidr if mode == "ClusterCIDR" else None)
        if not value:
            return None
        if mode in ("ClusterCIDR", "NodeCIDR"):
            return f"! -s {value}"
        if mode == "BridgeInterface":
            return f"! -i {value}"
        if mode == "InterfaceNamePrefix":
            return f"! -i {value}+"
        raise ValueError(f"detectLocalMode {mode!r} is not supported")


def _c(name: str) -> str:
    return f'-m comment --comment "{ipset_specs.BY_NAME[name].comment}"'


Names = Callable[[str], str]  # an IPv4 set's name -> the name of its twin being rendered


def _nat(cfg: RulesConfig, sets: frozenset[str], n: Names, family: int) -> list[str]:
    r = ["*nat"] + [f":{c} - [0:0]" for c in NAT_CHAINS]
    r.append(f"-A KUBE-SERVICES -s {'::1/128' if family == 6 else '127.0.0.0/8'} -j RETURN")
    if ipset_specs.LOOP_BACK in sets:
        r.append(
            f"-A KUBE-POSTROUTING {_c(ipset_specs.LOOP_BACK)} "
            f"-m set --match-set {n(ipset_specs.LOOP_BACK)} "
            "dst,dst,src -j MASQUERADE"
        )
    if ipset_specs.LOAD_BALANCER in sets:
        r.append(
            f"-A KUBE-SERVICES {_c(ipset_specs.LOAD_BALANCER)} "
            f"-m set --match-set {n(ipset_specs.LOAD_BALANCER)} "
            "dst,dst -j KUBE-LOAD-BALANCER"
        )
    if ipset_specs.LOAD_BALANCER_LOCAL in sets:
        r.append(
            f"-A KUBE-LOAD-BALANCER {_c(ipset_specs.LOAD_BALANCER_LOCAL)} -m set --match-set "
            f"{n(ipset_specs.LOAD_BALANCER_LOCAL)} dst,dst -j RETURN"
        )
    for proto, local, every, match in (
        ("tcp", ipset_specs.NODE_PORT_LOCAL_TCP, ipset_specs.NODE_PORT_TCP, "dst"),
        ("udp", ipset_specs.NODE_PORT_LOCAL_UDP, ipset_specs.NODE_PORT_UDP, "dst"),
        ("sctp", ipset_specs.NODE_PORT_LOCAL_SCTP, ipset_specs.NODE_PORT_SCTP, "dst,dst"),
    ):
        if local in sets:
            r.append(
                f"-A KUBE-NODE-PORT -p {proto} {_c(local)} -m set --match-set {n(local)} "
                f"{match} -j RETURN"
            )
        if every in sets:
            r.append(
                f"-A KUBE-NODE-PORT -p {proto} {_c(every)} -m set --match-set {n(every)} "
                f"{match} -j KUBE-MARK-MASQ"
            )
    if ipset_specs.CLUSTER_IP in sets:
        head = (
            f"-A KUBE-SERVICES {_c(ipset_specs.CLUSTER_IP)} "
            f"-m set --match-set {n(ipset_specs.CLUSTER_IP)}"
        )
        not_local = cfg.if_not_local()
        if cfg.masquerade_all:
            r.append(f"{head} dst,dst -j KUBE-MARK-MASQ")
        elif not_local:
            r.append(f"{head} dst,dst {not_local} -j KUBE-MARK-MASQ")
        else:
            r.append(f"{head} src,dst -j KUBE-MARK-MASQ")
    if ipset_specs.NO_LOCAL_ENDPOINTS in sets:
        # Pods and the node reach these through the cluster's endpoints: the node's own
        # traffic masqueraded (its source would be the service address, whose answers never
        # come back), pods' traffic with their own address as upstream's ("pod traffic for
        # external destinations" goes to the cluster's endpoints unmarked). Before the
        # external IPs' ACCEPT rules, which would end the chain for the node.
        r.append(
            f"-A KUBE-SERVICES {_c(ipset_specs.NO_LOCAL_ENDPOINTS)} -m set --match-set "
            f"{n(ipset_specs.NO_LOCAL_ENDPOINTS)} dst,dst -m addrtype --src-type LOCAL "
            "-j KUBE-MARK-MASQ"
        )
    for name, masq in ((ipset_specs.EXTERNAL_IP, True), (ipset_specs.EXTERNAL_IP_LOCAL, False)):
        if name not in sets:
            continue
        head = f"-A KUBE-SERVICES {_c(name)} -m set --match-set {n(name)} dst,dst"
        if masq:
            r.append(f"{head} -j KUBE-MARK-MASQ")
        r.append(f"{head} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT")
        r.append(f"{head} -m addrtype --dst-type LOCAL -j ACCEPT")
    r.append("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT")
    r.append("-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ")
    if ipset_specs.CLUSTER_IP in sets:
        r.append(
            f"-A KUBE-SERVICES -m set --match-set {n(ipset_specs.CLUSTER_IP)} dst,dst -j ACCEPT"
        )
    if ipset_specs.LOAD_BALANCER in sets:
        r.append(
            f"-A KUBE-SERVICES -m set --match-set {n(ipset_specs.LOAD_BALANCER)} dst,dst -j ACCEPT"
        )
    mark = cfg.mark
    r += [
        f"-A KUBE-POSTROUTING -m mark ! --mark {mark}/{mark} -j RETURN",
        f"-A KUBE-POSTROUTING -j MARK --xor-mark {mark}",
        '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" '
        "-j MASQUERADE" + (" --random-fully" if cfg.random_fully else ""),
        f"-A KUBE-MARK-MASQ -j MARK --or-mark {mark}",
        "COMMIT",
    ]
    return r


def _filter(
    cfg: RulesConfig, sets: frozenset[str], out_filters: Iterable[OutFilter], n: Names
) -> list[str]:
    r = ["*filter"] + [f":{c} - [0:0]" for c in FILTER_CHAINS]
    if ipset_specs.LOAD_BALANCER_FW in sets:
        r.append(
            f"-A KUBE-PROXY-FIREWALL {_c(ipset_specs.LOAD_BALANCER_FW)} -m set --match-set "
            f"{n(ipset_specs.LOAD_BALANCER_FW)} dst,dst -j KUBE-SOURCE-RANGES-FIREWALL"
        )
    for name in (ipset_specs.LOAD_BALANCER_SOURCE_CIDR, ipset_specs.LOAD_BALANCER_SOURCE_IP):
        if name in sets:
            r.append(
                f"-A KUBE-SOURCE-RANGES-FIREWALL {_c(name)} -m set --match-set {n(name)} "
                "dst,dst,src -j RETURN"
            )
    r.append("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP")
    if ipset_specs.NO_LOCAL_ENDPOINTS in sets:
        # New connections from outside (not a pod, not the node) are not forwarded.
        not_local = cfg.if_not_local()
        r.append(
            f"-A KUBE-PROXY-FIREWALL {_c(ipset_specs.NO_LOCAL_ENDPOINTS)} -m set --match-set "
            f"{n(ipset_specs.NO_LOCAL_ENDPOINTS)} dst,dst -m conntrack --ctstate NEW"
            + (f" {not_local}" if not_local else "")
            + " -m addrtype ! --src-type LOCAL -j DROP"
        )
    for f in out_filters:
        r.append(
            f"-A KUBE-IPVS-OUT-FILTER -s {f.address} -m ipvs --vaddr {f.address} "
            f"--vproto {f.protocol.value.lower()} --vport {f.port} -j DROP"
        )
    mark = cfg.mark
    r += [
        '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding rules" '
        f"-m mark --mark {mark}/{mark} -j ACCEPT",
        '-A KUBE-FORWARD -m comment --comment "kubernetes forwarding conntrack rule" '
        "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        f"-A KUBE-NODE-PORT {_c(ipset_specs.HEALTH_CHECK_NODE_PORT)} -m set --match-set "
        f"{n(ipset_specs.HEALTH_CHECK_NODE_PORT)} dst -j ACCEPT",
    ]
    for name, match in (
        (ipset_specs.LOAD_BALANCER, "dst,dst"),
        (ipset_specs.CLUSTER_IP, "dst,dst"),
        (ipset_specs.EXTERNAL_IP, "dst,dst"),
        (ipset_specs.EXTERNAL_IP_LOCAL, "dst,dst"),
        (ipset_specs.HEALTH_CHECK_NODE_PORT, "dst"),
    ):
        r.append(f"-A KUBE-IPVS-FILTER -m set --match-set {n(name)} {match} -j RETURN")
    r.append(
        "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set "
        f"{n(ipset_specs.IPVS_IPS)} dst -j REJECT"
    )
    r.append("COMMIT")
    return r


def render(
    cfg: RulesConfig, sets: frozenset[str], out_filters: Iterable[OutFilter], family: int = 4
) -> str:
    """The iptables-restore --noflush text for ipvsproxy's own chains (built-ins untouched) of
    ``family``'s proxier: ``sets`` names the non-empty sets (of any family), ``out_filters``
    may be of any family (those of ``family`` are rendered)."""

    def n(name: str) -> str:
        return ipset_specs.for_family(name, family)

    mine = frozenset(base for base in ipset_specs.V6 if n(base) in sets)
    v6 = family == 6
    filters = [f for f in out_filters if (":" in f.address) == v6]
    fam_cfg = cfg.for_family(family)
    return "\n".join(_nat(fam_cfg, mine, n, family) + _filter(fam_cfg, mine, filters, n)) + "\n"


# The sets whose rules are rendered only while they have members: each set's rules are a
# group the dataplane can leave out when the kernel refuses them (a match it lacks, as
# -m physdev), failing only the Services with members in that set. The other sets' rules
# (KUBE-IPVS-FILTER's, KUBE-NODE-PORT's health checks) are the base every node needs.
OPTIONAL_SETS = (
    ipset_specs.CLUSTER_IP,
    ipset_specs.LOOP_BACK,
    ipset_specs.LOAD_BALANCER,
    ipset_specs.LOAD_BALANCER_LOCAL,
    ipset_specs.LOAD_BALANCER_FW,
    ipset_specs.LOAD_BALANCER_SOURCE_CIDR,
    ipset_specs.LOAD_BALANCER_SOURCE_IP,
    ipset_specs.NODE_PORT_TCP,
    ipset_specs.NODE_PORT_LOCAL_TCP,
    ipset_specs.NODE_PORT_UDP,
    ipset_specs.NODE_PORT_LOCAL_UDP,
    ipset_specs.NODE_PORT_SCTP,
    ipset_specs.NODE_PORT_LOCAL_SCTP,
    ipset_specs.NO_LOCAL_ENDPOINTS,
    ipset_specs.EXTERNAL_IP,
    ipset_specs.EXTERNAL_IP_LOCAL,
)


# The group of KUBE-IPVS-OUT-FILTER's rules (-m ipvs): the Services with an OutFilter own it.
OUT_FILTERS = "KUBE-IPVS-OUT-FILTER"


def rule_groups(
    sets: Iterable[str], families: Iterable[int] = (4,), out_filters: bool = False
) -> list[str]:
    """The optional sets of ``families`` among ``sets`` (non-empty sets of any family), in
    rendering order, and OUT_FILTERS if there are ``out_filters``: each one's rules can be
    left out of ``render_families`` on its own (a set by leaving it out of ``sets``, the
    out filters by rendering none)."""
    have = frozenset(sets)
    groups = [
        name
        for family in families
        for base in OPTIONAL_SETS
        if (name := ipset_specs.for_family(base, family)) in have
    ]
    return [*groups, OUT_FILTERS] if out_filters else groups


FAMILY_MARK = "# ipvsproxy: ip6tables-restore from here"


def render_families(
    cfg: RulesConfig,
    sets: frozenset[str],
    out_filters: Iterable[OutFilter],
    families: Iterable[int] = (4,),
) -> str:
    """The rules of every family the proxy serves, as one text: IPv4's (iptables-restore), then
    a FAMILY_MARK line and IPv6's (ip6tables-restore). IPv4 alone is ``render``'s text."""
    filters = list(out_filters)
    wanted = set(families)
    parts = [render(cfg, sets, filters, 4)] if 4 in wanted else [""]
    if 6 in wanted:
        parts.append(f"{FAMILY_MARK}\n" + render(cfg, sets, filters, 6))
    return "".join(parts)


def split_families(text: str) -> dict[int, str]:
    """``render_families``' text by family (4: before the mark, 6: after it)."""
    v4, mark, v6 = text.partition(f"{FAMILY_MARK}\n")
    out = {4: v4} if v4 else {}
    if mark:
        out[6] = v6
    return out


# -- our chains as a text shows them (iptables-save's, or render's) ---------------------------

OURS = {"nat": frozenset(NAT_CHAINS), "filter": frozenset(FILTER_CHAINS)}
ChainKey = tuple[int, str, str]  # (family, table, chain)


def chain_lines(table: str, text: str) -> dict[str, list[str]]:
    """Each of our chains of ``table`` that ``text`` (``iptables-save -t TABLE``'s) shows:
    its declaration and its rules, as the text has them, in its order."""
    ours = OURS.get(table, frozenset())
    chains: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line.startswith(":"):
            name = line[1:].split(" ", 1)[0]
        elif line.startswith("-A "):
            name = line.split(" ", 2)[1]
        else:
            continue
        if name in ours:
            chains.setdefault(name, []).append(line)
    return chains


def chain_digest(lines: Iterable[str]) -> str:
    """A chain's digest: its lines in any order (as the dataplane's fingerprint of them)."""
    return hashlib.sha256("\n".join(sorted(lines)).encode()).hexdigest()


def chain_digests(saved: Mapping[str, str], family: int = 4) -> dict[ChainKey, str]:
    """The digest of each of our chains that ``saved`` (table -> ``iptables-save -t TABLE``
    of ``family``) shows."""
    return {
        (family, table, chain): chain_digest(lines)
        for table, text in saved.items()
        for chain, lines in chain_lines(table, text).items()
    }


def is_jump(line: str, jump: Jump) -> bool:
    """``line`` (iptables-save's) is ``jump`` in its built-in chain."""
    return (
        line.startswith(f"-A {jump.chain} ")
        and f'--comment "{jump.comment}"' in line
        and line.endswith(f"-j {jump.target}")
    )


def missing_jumps(table: str, text: str, family: int = 4) -> list[Jump]:
    """The jumps of ``table`` that ``text`` (``iptables-save -t TABLE``'s) lacks."""
    lines = text.splitlines()
    return [
        replace(j, family=family)
        for j in JUMPS
        if j.table == table and not any(is_jump(ln, j) for ln in lines)
    ]


def rendered_chains(text: str) -> dict[ChainKey, list[str]]:
    """Each chain ``render_families``' text writes, with its lines, by (family, table, chain)."""
    chains: dict[ChainKey, list[str]] = {}
    for family, part in split_families(text).items():
        tables: dict[str, list[str]] = {}
        table = ""
        for line in part.splitlines():
            if line.startswith("*"):
                table = line[1:]
            tables.setdefault(table, []).append(line)
        for table, lines in tables.items():
            for chain, mine in chain_lines(table, "\n".join(lines)).items():
                chains[(family, table, chain)] = mine
    return chains
