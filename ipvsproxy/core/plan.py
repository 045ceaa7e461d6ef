"""The planner: one Service and its EndpointSlices in, that Service's share of the node's
dataplane out. Pure, and per Service, so a change costs time in proportion to that Service.

Semantics follow upstream kube-proxy's IPVS proxier; where IPVS mode's behaviour is a known
bug that the nftables mode fixed, the nftables behaviour is kept (externalTrafficPolicy Local
with no local endpoint: external traffic is not forwarded, rather than forwarded without SNAT
to remote endpoints whose replies are lost; pods and the node itself still reach the Service
through the cluster's endpoints, masqueraded).
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from ipvsproxy.core import identities, ipset_specs, topology
from ipvsproxy.core.service_ports import (
    Endpoint,
    InvalidObject,
    ServicePort,
    creation_time,
    endpoints_by_port,
    is_proxied,
    service_ports,
)
from ipvsproxy.core.virtual_servers import (
    SVC_F_PERSISTENT,
    DestKey,
    Protocol,
    ServiceKey,
    VirtualServer,
    new_dest_key,
)

SVC_F_SCHED_SH_PORT = 0x0010  # upstream sets it for the mh scheduler


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the planner must know about this node."""

    name: str
    node_ips: tuple[str, ...] = ()  # addresses that carry NodePorts, of both families
    local_addresses: frozenset[str] = frozenset()  # on interfaces other than kube-ipvs0
    primary_ip: str | None = None
    zone: str = ""  # its topology.kubernetes.io/zone label ("": none)
    primary_ip6: str | None = None

    def primary(self, family: int) -> str | None:
        """The node IP of ``family`` (the source-range check of its own traffic)."""
        return self.primary_ip6 if family == 6 else self.primary_ip

    def node_ips_of(self, family: int) -> tuple[str, ...]:
        v6 = family == 6
        return tuple(ip for ip in self.node_ips if (":" in ip) == v6)


@dataclass(frozen=True, slots=True)
class PlanConfig:
    scheduler: str = "rr"
    proxy_name: str | None = None
    families: tuple[int, ...] = (4,)  # the IP families this node's proxy serves
    # Addresses no externalIP or load-balancer IP may take: the API server's, as the daemon
    # connects to it (one bound on kube-ipvs0 would cut the node off from the API).
    reserved: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class OutFilter:
    """A load-balancer VIP whose source ranges exclude this node: node-local clients of it are
    dropped (upstream KUBE-IPVS-OUT-FILTER, kubernetes #119656)."""

    address: str
    protocol: Protocol
    port: int


def _sealed(d: dict[Any, Any]) -> Mapping[Any, Any]:
    """A read-only view of a dict the builder made and lets go of: never a copy, as nothing
    else holds the dict once the plan is built."""
    return MappingProxyType(d)


@dataclass(frozen=True, slots=True)
class ServicePlan:
    """One Service's share of the node's desired dataplane."""

    virtual_servers: Mapping[ServiceKey, VirtualServer] = field(default_factory=dict)
    real_servers: Mapping[ServiceKey, Mapping[DestKey, DestKey]] = field(default_factory=dict)
    bind: frozenset[str] = frozenset()
    members: Mapping[str, frozenset[str]] = field(default_factory=dict)
    out_filters: frozenset[OutFilter] = frozenset()
    # The traffic policies ("internal", "external") and families (4, 6) for which the
    # Service has endpoints but none on this node (upstream's serviceNoLocalEndpoints sets)
    no_local_endpoints: frozenset[tuple[str, int]] = frozenset()
    error: str | None = None  # why the Service could not be programmed
    warnings: tuple[str, ...] = ()  # what of it was left out, and why (the rest is planned)
    created: str = ""  # the Service's creationTimestamp, normalised (who had an address first)
    identity: identities.ServiceIdentity = field(
        default_factory=identities.ServiceIdentity
    )  # names, for status


EMPTY = ServicePlan()


class _Builder:
    def __init__(self) -> None:
        self.family = 4  # the family being planned: its sets' names (ipset_specs.for_family)
        self.vs: dict[ServiceKey, VirtualServer] = {}
        self.rs: dict[ServiceKey, dict[DestKey, DestKey]] = {}
        self.bind: set[str] = set()
        self.members: defaultdict[str, set[str]] = defaultdict(set)
        self.out_filters: set[OutFilter] = set()
        self.no_local: set[tuple[str, int]] = set()
        self.ids: dict[ServiceKey, identities.VirtualServerIdentity] = {}
        self.eps: dict[str, identities.EndpointIdentity] = {}
        # The real servers of the last endpoint list seen: the virtual servers of one port
        # (cluster IP, node ports, load-balancer VIPs) mostly share one, and so its mapping.
        self._last: tuple[list[Endpoint], dict[DestKey, DestKey]] | None = None

    def add_vs(self, vs: VirtualServer, endpoints: Chosen, sp: ServicePort, role: str) -> None:
        self.vs[vs.key] = vs
        self.ids[vs.key] = identities.VirtualServerIdentity(
            sp.service, sp.name, sp.port, sp.type, role, endpoints.rule
        )
        self._add_rs(vs, endpoints.endpoints)

    def _add_rs(self, vs: VirtualServer, endpoints: list[Endpoint]) -> None:
        if self._last is not None and self._last[0] is endpoints:
            self.rs[vs.key] = self._last[1]
            return
        # Each key is its own value (weight 1, masquerade: see DestKey).
        rs = {key: key for key in [new_dest_key((e.address, e.port)) for e in endpoints]}
        self._last = (endpoints, rs)
        self.rs[vs.key] = rs

    def member(self, set_name: str, entry: str) -> None:
        """``entry`` in the set named ``set_name`` (an IPv4 name) of the family planned."""
        if self.family == 6:
            set_name = ipset_specs.V6[set_name]
        self.members[set_name].add(entry)

    def build(self, warnings: tuple[str, ...] = (), created: str = "") -> ServicePlan:
        frozen: dict[int, Mapping[DestKey, DestKey]] = {}  # one copy of each shared mapping
        real_servers = {}
        for key, rs in self.rs.items():
            if id(rs) not in frozen:
                frozen[id(rs)] = _sealed(rs)
            real_servers[key] = frozen[id(rs)]
        return ServicePlan(
            virtual_servers=_sealed(self.vs),
            real_servers=_sealed(real_servers),
            bind=frozenset(self.bind),
            members=_sealed({k: frozenset(v) for k, v in self.members.items() if v}),
            out_filters=frozenset(self.out_filters),
            no_local_endpoints=frozenset(self.no_local),
            warnings=warnings,
            created=created,
            identity=identities.ServiceIdentity.of(self.ids, self.eps),
        )


@dataclass(frozen=True, slots=True)
class Chosen:
    """The endpoints a virtual server sends to, and the rule that chose them (for status):
    identities.TOPOLOGY_LOCAL, _CLUSTER, _SAME_ZONE or _SAME_NODE."""

    endpoints: list[Endpoint]
    rule: str


_RULES = {
    topology.NO_TOPOLOGY: identities.TOPOLOGY_CLUSTER,
    topology.SAME_ZONE: identities.TOPOLOGY_SAME_ZONE,
    topology.SAME_NODE: identities.TOPOLOGY_SAME_NODE,
}


def _virtual_server(sp: ServicePort, address: str, port: int, cfg: PlanConfig) -> VirtualServer:
    flags, timeout = 0, 0
    if sp.affinity_timeout:
        flags, timeout = SVC_F_PERSISTENT, sp.affinity_timeout
    scheduler = sp.scheduler or cfg.scheduler
    if scheduler == "mh":
        flags |= SVC_F_SCHED_SH_PORT
    return VirtualServer(ServiceKey(address, sp.protocol, port), scheduler, flags, timeout)


def _plan_port(
    b: _Builder, sp: ServicePort, endpoints: list[Endpoint], node: NodeFacts, cfg: PlanConfig
) -> None:
    proto = sp.protocol.value.lower()
    cluster_eps, mode = topology.cluster_endpoints(endpoints, node.name, node.zone)
    cluster = Chosen(cluster_eps, _RULES[mode])
    local = Chosen(topology.local_endpoints(endpoints, node.name), identities.TOPOLOGY_LOCAL)
    internal = local if sp.internal_local else cluster
    external = local if sp.external_local else cluster
    if cluster.endpoints and not local.endpoints:
        _no_local(b, sp, node)
    # externalTrafficPolicy Local and no local endpoint: external clients are not forwarded
    # (the filter drops them: KUBE-NO-LOCAL-ENDPOINTS), but pods and the node itself reach the
    # external destinations through the cluster's endpoints, the node masqueraded (upstream's
    # "pod traffic for external destinations" and "masquerade LOCAL traffic").
    short = sp.external_local and not local.endpoints and bool(cluster.endpoints)
    if short:
        external = cluster
    eps = b.eps
    for e in endpoints:
        known = eps.get(e.address)
        if known is None or known.pod != e.pod or known.node != e.node:
            eps[e.address] = identities.EndpointIdentity(e.pod, e.node)
        if e.node == node.name:
            b.member(ipset_specs.LOOP_BACK, f"{e.address},{proto}:{e.port},{e.address}")
    for ip in sp.cluster_ips:
        b.add_vs(_virtual_server(sp, ip, sp.port, cfg), internal, sp, identities.ROLE_CLUSTER_IP)
        b.bind.add(ip)
        b.member(ipset_specs.CLUSTER_IP, f"{ip},{proto}:{sp.port}")
    for ip in sp.external_ips:
        b.add_vs(_virtual_server(sp, ip, sp.port, cfg), external, sp, identities.ROLE_EXTERNAL_IP)
        if ip not in node.local_addresses:
            b.bind.add(ip)
        entry = f"{ip},{proto}:{sp.port}"
        b.member(
            ipset_specs.EXTERNAL_IP_LOCAL if sp.external_local else ipset_specs.EXTERNAL_IP, entry
        )
        if short:
            b.member(ipset_specs.NO_LOCAL_ENDPOINTS, entry)
    for ip in sp.lb_vips:
        _plan_lb_vip(b, sp, ip, external, node, cfg)
        if short:
            b.member(ipset_specs.NO_LOCAL_ENDPOINTS, f"{ip},{proto}:{sp.port}")
    if sp.node_port:
        _plan_node_port(b, sp, external, node, cfg)
        if short:
            for ip in node.node_ips_of(b.family):
                b.member(ipset_specs.NO_LOCAL_ENDPOINTS, f"{ip},{proto}:{sp.node_port}")
    if sp.type == "LoadBalancer" and sp.external_local and sp.health_check_node_port:
        b.member(ipset_specs.HEALTH_CHECK_NODE_PORT, str(sp.health_check_node_port))


def _no_local(b: _Builder, sp: ServicePort, node: NodeFacts) -> None:
    """Upstream's syncEndpoint, for a virtual server that takes the local endpoints only (the
    cluster IP's with internalTrafficPolicy Local, an external one with externalTrafficPolicy
    Local) when there are none: the Service counts for each of its Local policies."""
    external = bool(sp.external_ips or sp.lb_vips or (sp.node_port and node.node_ips_of(b.family)))
    if sp.internal_local or (sp.external_local and external):
        if sp.internal_local:
            b.no_local.add(("internal", b.family))
        if sp.external_local:
            b.no_local.add(("external", b.family))


def _plan_lb_vip(
    b: _Builder,
    sp: ServicePort,
    ip: str,
    endpoints: Chosen,
    node: NodeFacts,
    cfg: PlanConfig,
) -> None:
    proto = sp.protocol.value.lower()
    entry = f"{ip},{proto}:{sp.port}"
    b.add_vs(_virtual_server(sp, ip, sp.port, cfg), endpoints, sp, identities.ROLE_LOAD_BALANCER)
    if ip not in node.local_addresses:
        b.bind.add(ip)
    b.member(ipset_specs.LOAD_BALANCER, entry)
    if sp.external_local:
        b.member(ipset_specs.LOAD_BALANCER_LOCAL, entry)
    if not sp.lb_source_ranges and not sp.lb_closed:
        return
    b.member(ipset_specs.LOAD_BALANCER_FW, entry)
    for cidr in sp.lb_source_ranges:
        b.member(ipset_specs.LOAD_BALANCER_SOURCE_CIDR, f"{entry},{cidr}")
    node_ip = node.primary(b.family)
    primary = ipaddress.ip_address(node_ip) if node_ip else None
    if primary is not None and any(primary in ipaddress.ip_network(c) for c in sp.lb_source_ranges):
        b.member(ipset_specs.LOAD_BALANCER_SOURCE_IP, f"{entry},{ip}")
    else:
        b.out_filters.add(OutFilter(ip, sp.protocol, sp.port))


_NODE_PORT_SETS = {
    Protocol.TCP: (ipset_specs.NODE_PORT_TCP, ipset_specs.NODE_PORT_LOCAL_TCP),
    Protocol.UDP: (ipset_specs.NODE_PORT_UDP, ipset_specs.NODE_PORT_LOCAL_UDP),
    Protocol.SCTP: (ipset_specs.NODE_PORT_SCTP, ipset_specs.NODE_PORT_LOCAL_SCTP),
}


def _plan_node_port(
    b: _Builder, sp: ServicePort, endpoints: Chosen, node: NodeFacts, cfg: PlanConfig
) -> None:
    node_ips = node.node_ips_of(b.family)
    if not node_ips:
        return
    all_set, local_set = _NODE_PORT_SETS[sp.protocol]
    for ip in node_ips:
        b.add_vs(
            _virtual_server(sp, ip, sp.node_port, cfg), endpoints, sp, identities.ROLE_NODE_PORT
        )
    if sp.protocol is Protocol.SCTP:
        entries = [f"{ip},sctp:{sp.node_port}" for ip in node_ips]
    else:
        entries = [str(sp.node_port)]
    for entry in entries:
        b.member(all_set, entry)
        if sp.external_local:
            b.member(local_set, entry)


def plan_service(
    svc: Mapping[str, Any] | None,
    slices: Iterable[Mapping[str, Any]],
    node: NodeFacts,
    cfg: PlanConfig,
) -> ServicePlan:
    """The desired dataplane for one Service (None: the Service is gone)."""
    if svc is None or not is_proxied(svc, cfg.proxy_name):
        return EMPTY
    fields: dict[str, str] = {}  # the Service's entries left out, and why
    try:
        ports = _refuse_taken(service_ports(svc, fields), node, cfg, fields)
    except InvalidObject as exc:
        return ServicePlan(error=str(exc))
    b = _Builder()
    skipped: dict[str, str] = {}
    planned = False
    cluster_ips = ports[0].cluster_ips if ports else ()
    for family in cfg.families:
        if not any((":" in ip) == (family == 6) for ip in cluster_ips):
            continue  # no cluster IP of this family: nothing for its proxier, as upstream's
        mine = [sp.of_family(family) for sp in ports]
        planned, b.family = True, family
        wanted = [(sp.name, sp.protocol) for sp in mine]
        by_port = endpoints_by_port(slices, wanted, skipped, family)
        for sp, endpoints in zip(mine, by_port, strict=True):
            _plan_port(b, sp, endpoints, node, cfg)
    if not planned:
        return EMPTY
    sid = ports[0].service
    warnings = [_fields_warning(sid, fields)] if fields else []
    if skipped:
        warnings.append(_skipped_warning(sid, skipped))
    return b.build(tuple(warnings), creation_time(svc))


def _refuse_taken(
    ports: list[ServicePort], node: NodeFacts, cfg: PlanConfig, fields: dict[str, str]
) -> list[ServicePort]:
    """``ports`` without the externalIPs and load-balancer IPs this node or the API server
    has (a node address would hand its host ports to the Service; the API server's, bound on
    kube-ipvs0, would cut the node off from the API), each in ``fields`` with the reason."""
    if not ports or not (ports[0].external_ips or ports[0].lb_vips):
        return ports
    own = node.local_addresses | {ip for ip in (node.primary_ip, node.primary_ip6) if ip}

    def kept(ips: tuple[str, ...], what: str) -> tuple[str, ...]:
        out = []
        for ip in ips:
            if ip in own:
                fields[f"{what} {ip!r}"] = "this node's address"
            elif ip in cfg.reserved:
                fields[f"{what} {ip!r}"] = "the API server's address"
            else:
                out.append(ip)
        return tuple(out)

    external_ips = kept(ports[0].external_ips, "externalIP")
    lb_vips = kept(ports[0].lb_vips, "load-balancer ingress IP")
    if (external_ips, lb_vips) == (ports[0].external_ips, ports[0].lb_vips):
        return ports
    return [replace(sp, external_ips=external_ips, lb_vips=lb_vips) for sp in ports]


MAX_NAMED = 10  # a warning names at most this many skipped addresses and ports


def _named(entries: Mapping[str, str]) -> str:
    """The first ``MAX_NAMED`` entries with their reasons, and how many more there are."""
    named = [f"{what} ({why})" for what, why in sorted(entries.items())[:MAX_NAMED]]
    more = len(entries) - len(named)
    return ", ".join(named) + (f" and {more} more" if more > 0 else "")


def _fields_warning(sid: str, fields: Mapping[str, str]) -> str:
    return (
        f"service {sid}: entries that cannot be programmed were skipped, the rest of the "
        f"Service is programmed: {_named(fields)}"
    )


def _skipped_warning(sid: str, skipped: Mapping[str, str]) -> str:
    return (
        f"service {sid}: EndpointSlice entries the kernel refuses were skipped, the other "
        f"endpoints are programmed: {_named(skipped)}"
    )
