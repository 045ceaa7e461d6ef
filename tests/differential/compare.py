"""The pure half of the differential tests: read what a proxy programmed (``ipvsadm -Sn``,
``ipset save``), put the node's own facts behind placeholders, and compare two nodes.

Both proxied nodes see the same API objects (so the same ClusterIPs, NodePorts, load-balancer
and external IPs) but differ in their own addresses. :class:`NodeFacts` names them so that the
node running upstream kube-proxy and the node running ipvsproxy read the same after
normalisation: the node's IP is ``NODE``, its pod bridge's address (both proxies treat it as a
node address) ``NODE-BRIDGE``, its own pods ``LOCAL-POD.<n>``; the other proxied node is
``PEER`` / ``PEER-BRIDGE`` / ``PEER-POD.<n>``. Everything else (the unproxied node-1, the
external client, Service addresses) is kept as it is.

Every difference left after normalisation must match an entry of ``ALLOWED`` (each one a bullet
of the README's "Differences from kube-proxy"); anything else fails the test.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from tests.differential import corpus

UPSTREAM = "kube-proxy"
OURS = "ipvsproxy"


@dataclass(frozen=True)
class NodeFacts:
    """What differs between two lab nodes that must not count as a difference."""

    ip: str
    bridge_ip: str
    pod_prefix: str  # "10.244.2." (the node's /24)
    peer_ip: str
    peer_bridge_ip: str
    peer_pod_prefix: str
    pod_name_prefix: str  # "pod-2-": the echo names of this node's pods
    peer_pod_name_prefix: str
    # The same of IPv6 ("" where the lab has none): "fd00:10:244:2::" as the pod prefix
    ip6: str = ""
    bridge_ip6: str = ""
    pod_prefix6: str = ""
    peer_ip6: str = ""
    peer_bridge_ip6: str = ""
    peer_pod_prefix6: str = ""

    def address(self, text: str) -> str:
        """One address (or CIDR) with the node's facts replaced."""
        addr, slash, bits = text.partition("/")
        for real, name in (
            (self.ip, "NODE"),
            (self.bridge_ip, "NODE-BRIDGE"),
            (self.peer_ip, "PEER"),
            (self.peer_bridge_ip, "PEER-BRIDGE"),
            (self.ip6, "NODE6"),
            (self.bridge_ip6, "NODE-BRIDGE6"),
            (self.peer_ip6, "PEER6"),
            (self.peer_bridge_ip6, "PEER-BRIDGE6"),
        ):
            if real and addr == real:
                return name + slash + bits
        for prefix, name in (
            (self.pod_prefix, "LOCAL-POD."),
            (self.peer_pod_prefix, "PEER-POD."),
            (self.pod_prefix6, "LOCAL-POD6::"),
            (self.peer_pod_prefix6, "PEER-POD6::"),
        ):
            if prefix and addr.startswith(prefix):
                return name + addr[len(prefix) :] + slash + bits
        return text

    def pod(self, name: str) -> str:
        """An echo server's pod name (``pod-2-1``) as seen from this node."""
        if name.startswith(self.pod_name_prefix):
            return "local-" + name[len(self.pod_name_prefix) :]
        if name.startswith(self.peer_pod_name_prefix):
            return "peer-" + name[len(self.peer_pod_name_prefix) :]
        return name

    def endpoint(self, text: str) -> str:
        """``ADDR:PORT`` (``[ADDR]:PORT`` for IPv6) with the address normalised."""
        addr, _, port = text.rpartition(":")
        if addr.startswith("["):
            return f"[{self.address(addr[1:-1])}]:{port}"
        return f"{self.address(addr)}:{port}"


# IPVS ------------------------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class RealServer:
    address: str  # ADDR:PORT, normalised
    forward: str  # masq, route, tunnel
    weight: int


@dataclass(frozen=True)
class VirtualServer:
    scheduler: str
    persistence: int  # seconds; 0: not persistent
    netmask: str  # persistence granularity; "" when not persistent
    real_servers: frozenset[RealServer] = field(default_factory=frozenset)

    def settings(self) -> tuple[str, int, str]:
        return (self.scheduler, self.persistence, self.netmask)


VSKey = tuple[str, str]  # (protocol, ADDR:PORT normalised)
PROTOCOL_FLAGS = {"-t": "TCP", "-u": "UDP", "--sctp-service": "SCTP", "-f": "FWM"}
FORWARD_FLAGS = {"-m": "masq", "-g": "route", "-i": "tunnel"}
# kube-proxy's start-up probe of IPVS (a dummy virtual server it deletes again at once).
PROBE = ("TCP", "198.51.100.0:20000")


def parse_ipvsadm(text: str, facts: NodeFacts) -> dict[VSKey, VirtualServer]:
    """``ipvsadm -Sn`` (one ``-A`` line per virtual server, one ``-a`` per real server)."""
    settings: dict[VSKey, tuple[str, int, str]] = {}
    reals: dict[VSKey, set[RealServer]] = {}
    for line in text.splitlines():
        words = line.split()
        if not words or words[0] not in ("-A", "-a"):
            continue
        key = (PROTOCOL_FLAGS[words[1]], facts.endpoint(words[2]))
        opts = _options(words[3:])
        if words[0] == "-A":
            persistent = "-p" in opts
            settings[key] = (
                opts.get("-s", ""),
                int(opts["-p"]) if persistent else 0,
                opts.get("-M", "255.255.255.255") if persistent else "",
            )
            reals.setdefault(key, set())
        else:
            forward = next((v for k, v in FORWARD_FLAGS.items() if k in opts), "?")
            reals.setdefault(key, set()).add(
                RealServer(facts.endpoint(opts["-r"]), forward, int(opts.get("-w", "1")))
            )
    return {
        key: VirtualServer(*settings[key], frozenset(reals.get(key, ())))
        for key in settings
        if key != PROBE
    }


def _options(words: list[str]) -> dict[str, str]:
    """``-s rr -p 10800 -m -w 1`` -> {"-s": "rr", "-p": "10800", "-m": "", "-w": "1"}."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(words):
        flag = words[i]
        if i + 1 < len(words) and not words[i + 1].startswith("-"):
            opts[flag] = words[i + 1]
            i += 2
        else:
            opts[flag] = ""
            i += 1
    return opts


# ipsets ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class IPSet:
    type: str
    members: frozenset[str]


def parse_ipset_save(text: str, facts: NodeFacts) -> dict[str, IPSet]:
    """``ipset save``: every set named KUBE-* (upstream's names), members normalised."""
    types: dict[str, str] = {}
    members: dict[str, set[str]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) < 3 or not words[1].startswith("KUBE-"):
            continue
        if words[0] == "create":
            types[words[1]] = words[2]
            members.setdefault(words[1], set())
        elif words[0] == "add":
            members.setdefault(words[1], set()).add(_member(words[2], facts))
    return {name: IPSet(types.get(name, "?"), frozenset(m)) for name, m in members.items()}


def _member(text: str, facts: NodeFacts) -> str:
    """``10.96.0.10,tcp:80,10.244.2.11`` with every address part normalised."""
    parts = []
    for part in text.split(","):
        addr = part.partition("/")[0]
        try:
            ipaddress.ip_address(addr)
        except ValueError:
            parts.append(part)
        else:
            parts.append(facts.address(part))
    return ",".join(parts)


# Differences -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """One thing the two nodes disagree on. ``kind``: ``ipvs`` (a virtual server's presence,
    settings or real servers), ``ipset`` (one member, or a set's presence or type) or
    ``traffic`` (one probe's outcome). ``upstream`` and ``ours`` say what each node has
    (``None``: nothing)."""

    kind: str
    key: str
    upstream: object
    ours: object
    shape: str = ""

    def __str__(self) -> str:
        where = f" [{self.shape}]" if self.shape else ""
        return f"{self.kind} {self.key}{where}: {UPSTREAM}={self.upstream!r} {OURS}={self.ours!r}"


def diff_ipvs(
    upstream: Mapping[VSKey, VirtualServer],
    ours: Mapping[VSKey, VirtualServer],
    owner: Callable[[VSKey], str] = lambda _k: "",
) -> list[Difference]:
    out: list[Difference] = []
    for key in sorted(set(upstream) | set(ours)):
        name = f"{key[0]} {key[1]}"
        up, our = upstream.get(key), ours.get(key)
        if up is None or our is None:
            out.append(Difference("ipvs", name, _summary(up), _summary(our), owner(key)))
            continue
        if up.settings() != our.settings():
            out.append(Difference("ipvs", name + " settings", up.settings(), our.settings()))
        # By address: a real server's forwarding or weight differing is one difference.
        up_rs = {rs.address: _rs(rs) for rs in up.real_servers}
        our_rs = {rs.address: _rs(rs) for rs in our.real_servers}
        for addr in sorted(set(up_rs) | set(our_rs)):
            if up_rs.get(addr) != our_rs.get(addr):
                diff = Difference(
                    "ipvs", f"{name} -> {addr}", up_rs.get(addr), our_rs.get(addr), owner(key)
                )
                out.append(diff)
    return out


def _summary(vs: VirtualServer | None) -> object:
    if vs is None:
        return None
    return (*vs.settings(), tuple(sorted(rs.address for rs in vs.real_servers)))


def _rs(rs: RealServer) -> str:
    return f"{rs.forward} w{rs.weight}"


def diff_ipsets(upstream: Mapping[str, IPSet], ours: Mapping[str, IPSet]) -> list[Difference]:
    out: list[Difference] = []
    for name in sorted(set(upstream) | set(ours)):
        up, our = upstream.get(name), ours.get(name)
        if up is None or our is None:
            out.append(
                Difference(
                    "ipset",
                    name,
                    None if up is None else up.type,
                    None if our is None else our.type,
                )
            )
            continue
        if up.type != our.type:
            out.append(Difference("ipset", name + " type", up.type, our.type))
        for member in sorted(up.members ^ our.members):
            out.append(
                Difference(
                    "ipset",
                    f"{name} {member}",
                    member in up.members or None,
                    member in our.members or None,
                )
            )
    return out


def diff_traffic(
    upstream: Mapping[str, object], ours: Mapping[str, object], shape_of: Callable[[str], str]
) -> list[Difference]:
    return [
        Difference("traffic", probe, upstream.get(probe), ours.get(probe), shape_of(probe))
        for probe in sorted(set(upstream) | set(ours))
        if upstream.get(probe) != ours.get(probe)
    ]


REPROBES = 2  # times a traffic difference is probed again before it counts


def reprobe(
    diffs: list[Difference],
    probe: Callable[[set[str]], tuple[Mapping[str, object], Mapping[str, object]]],
    times: int = REPROBES,
) -> tuple[list[Difference], list[Difference]]:
    """Each traffic difference of ``diffs`` probed again on both nodes (``probe``: the probes
    of the shapes named, upstream's and ours) up to ``times`` times: (those that differed
    every time, those the two nodes answered the same at a re-probe).

    One node is probed seconds after the other, so the slow end of a step (a drained real
    server deleted, an affinity template on a weight-0 real server expiring) or one request
    lost in the busy guest can fall on one node's probes only; a difference in what the
    proxies programmed shows at every probe."""
    transient: list[Difference] = []
    for _ in range(times):
        if not diffs:
            break
        upstream, ours = probe({d.shape for d in diffs})
        still = [d for d in diffs if upstream.get(d.key) != ours.get(d.key)]
        transient += [d for d in diffs if d not in still]
        diffs = still
    return diffs, transient


# Allowed differences ---------------------------------------------------------------------


@dataclass(frozen=True)
class Allowed:
    """A difference the README's "Differences from kube-proxy" lists (``readme``: the
    bullet's bold title), and the rule that recognises it."""

    name: str
    readme: str
    reason: str
    matches: Callable[[Difference], bool]
    in_corpus: bool = True  # the corpus as created shows it (else only some live changes do)


def _no_local_endpoints_set(d: Difference) -> bool:
    own = ("KUBE-NO-LOCAL-ENDPOINTS", "KUBE-6-NO-LOCAL-ENDPOINTS")  # and its IPv6 twin
    return d.kind == "ipset" and d.key.startswith(own) and d.upstream is None


# The shapes with externalTrafficPolicy Local (with or without a local endpoint, as the live
# changes make them).
ETP_LOCAL = frozenset(
    s.name for s in corpus.SHAPES if s.spec.get("externalTrafficPolicy") == "Local"
)


def _node_reaches_external_destinations(d: Difference) -> bool:
    """The node itself to an external IP or load-balancer IP of an eTP Local Service without
    a local endpoint: upstream's virtual server holds the cluster's endpoints but the node's
    packets leave with the service address as their source, unmasqueraded, and the answer
    never comes back; ipvsproxy masquerades them."""
    kind = d.key.split()[2] if len(d.key.split()) > 2 else ""
    return (
        d.kind == "traffic"
        and d.shape in ETP_LOCAL
        and d.key.endswith(" from node")
        and kind in ("externalIP", "loadBalancer")
        and d.upstream == "timeout"
        and isinstance(d.ours, tuple)
        and d.ours[1] == ("NODE",)
    )


def _drain_timing(d: Difference) -> bool:
    """A removed TCP real server still draining (weight 0) on one node and gone on the
    other."""
    return d.kind == "ipvs" and " -> " in d.key and {d.upstream, d.ours} == {"masq w0", None}


ALLOWED: tuple[Allowed, ...] = (
    Allowed(
        "node-to-external-destinations",
        "externalTrafficPolicy Local with no local endpoint",
        "upstream IPVS mode's known bug: the node cannot reach the external IPs and "
        "load-balancer IPs of such a Service; ipvsproxy masquerades the node's own traffic to "
        "the cluster's endpoints, as the iptables and nftables modes do",
        _node_reaches_external_destinations,
    ),
    Allowed(
        "drain-timing",
        "Graceful termination is bounded",
        "a removed TCP real server stays at weight 0 while it has connections on both; "
        "upstream's graceful-termination manager looks at it once a minute, ipvsproxy at "
        "its syncs, so one may delete it before the other",
        _drain_timing,
        in_corpus=False,
    ),
    Allowed(
        "no-local-endpoints-set",
        "externalTrafficPolicy Local with no local endpoint",
        "ipvsproxy's own set KUBE-NO-LOCAL-ENDPOINTS marks pod and node traffic to an "
        "eTP Local address with no local endpoint for masquerade; upstream has no such set",
        _no_local_endpoints_set,
    ),
)


def unexplained(
    diffs: Iterable[Difference], allowed: Iterable[Allowed] = ALLOWED
) -> tuple[list[Difference], dict[str, list[Difference]]]:
    """Split ``diffs`` into those no allowed entry matches and, per allowed entry's name,
    those it explains."""
    rules = list(allowed)
    left: list[Difference] = []
    used: dict[str, list[Difference]] = {}
    for d in diffs:
        rule = next((r for r in rules if r.matches(d)), None)
        if rule is None:
            left.append(d)
        else:
            used.setdefault(rule.name, []).append(d)
    return left, used
