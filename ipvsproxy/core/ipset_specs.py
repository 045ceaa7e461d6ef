"""The ipsets ipvsproxy owns: upstream kube-proxy's IPVS-mode names, types and comments.

Keeping upstream's names means an operator's `ipset list KUBE-CLUSTER-IP` and existing
runbooks still apply on a node that runs ipvsproxy.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from ipvsproxy.core.virtual_servers import ServiceKey


@dataclass(frozen=True, slots=True)
class IPSetSpec:
    name: str
    type: str
    comment: str
    family: int = 4  # 4 or 6: the addresses its members hold (a bitmap:port's: its proxier's)


LOOP_BACK = "KUBE-LOOP-BACK"
CLUSTER_IP = "KUBE-CLUSTER-IP"
EXTERNAL_IP = "KUBE-EXTERNAL-IP"
EXTERNAL_IP_LOCAL = "KUBE-EXTERNAL-IP-LOCAL"
LOAD_BALANCER = "KUBE-LOAD-BALANCER"
LOAD_BALANCER_LOCAL = "KUBE-LOAD-BALANCER-LOCAL"
LOAD_BALANCER_FW = "KUBE-LOAD-BALANCER-FW"
LOAD_BALANCER_SOURCE_CIDR = "KUBE-LOAD-BALANCER-SOURCE-CIDR"
LOAD_BALANCER_SOURCE_IP = "KUBE-LOAD-BALANCER-SOURCE-IP"
NODE_PORT_TCP = "KUBE-NODE-PORT-TCP"
NODE_PORT_LOCAL_TCP = "KUBE-NODE-PORT-LOCAL-TCP"
NODE_PORT_UDP = "KUBE-NODE-PORT-UDP"
NODE_PORT_LOCAL_UDP = "KUBE-NODE-PORT-LOCAL-UDP"
NODE_PORT_SCTP = "KUBE-NODE-PORT-SCTP-HASH"
NODE_PORT_LOCAL_SCTP = "KUBE-NODE-PORT-LOCAL-SCTP-HASH"
HEALTH_CHECK_NODE_PORT = "KUBE-HEALTH-CHECK-NODE-PORT"
# Not upstream's (its iptables and nftables modes use per-Service chains for this): external
# destinations of externalTrafficPolicy Local Services with no endpoint on this node, reached
# by pods and the node itself through the cluster's endpoints.
NO_LOCAL_ENDPOINTS = "KUBE-NO-LOCAL-ENDPOINTS"
IPVS_IPS = "KUBE-IPVS-IPS"

_IP_PORT = "hash:ip,port"
_BITMAP = "bitmap:port"

SPECS_V4: tuple[IPSetSpec, ...] = (
    IPSetSpec(
        LOOP_BACK,
        "hash:ip,port,ip",
        "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose",
    ),
    IPSetSpec(CLUSTER_IP, _IP_PORT, "Kubernetes service cluster ip + port for masquerade purpose"),
    IPSetSpec(
        EXTERNAL_IP,
        _IP_PORT,
        "Kubernetes service external ip + port for masquerade and filter purpose",
    ),
    IPSetSpec(
        EXTERNAL_IP_LOCAL,
        _IP_PORT,
        "Kubernetes service external ip + port with externalTrafficPolicy=local",
    ),
    IPSetSpec(LOAD_BALANCER, _IP_PORT, "Kubernetes service lb portal"),
    IPSetSpec(
        LOAD_BALANCER_LOCAL,
        _IP_PORT,
        "Kubernetes service load balancer ip + port with externalTrafficPolicy=local",
    ),
    IPSetSpec(
        LOAD_BALANCER_FW,
        _IP_PORT,
        "Kubernetes service load balancer ip + port for load balancer with sourceRange",
    ),
    IPSetSpec(
        LOAD_BALANCER_SOURCE_CIDR,
        "hash:ip,port,net",
        "Kubernetes service load balancer ip + port + source cidr for packet filter purpose",
    ),
    IPSetSpec(
        LOAD_BALANCER_SOURCE_IP,
        "hash:ip,port,ip",
        "Kubernetes service load balancer ip + port + source IP for packet filter purpose",
    ),
    IPSetSpec(NODE_PORT_TCP, _BITMAP, "Kubernetes nodeport TCP port for masquerade purpose"),
    IPSetSpec(
        NODE_PORT_LOCAL_TCP,
        _BITMAP,
        "Kubernetes nodeport TCP port with externalTrafficPolicy=local",
    ),
    IPSetSpec(NODE_PORT_UDP, _BITMAP, "Kubernetes nodeport UDP port for masquerade purpose"),
    IPSetSpec(
        NODE_PORT_LOCAL_UDP,
        _BITMAP,
        "Kubernetes nodeport UDP port with externalTrafficPolicy=local",
    ),
    IPSetSpec(
        NODE_PORT_SCTP,
        _IP_PORT,
        "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'",
    ),
    IPSetSpec(
        NODE_PORT_LOCAL_SCTP,
        _IP_PORT,
        "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'",
    ),
    IPSetSpec(HEALTH_CHECK_NODE_PORT, _BITMAP, "Kubernetes health check node port"),
    IPSetSpec(
        NO_LOCAL_ENDPOINTS,
        _IP_PORT,
        "Kubernetes service external ip + port with externalTrafficPolicy=local and no local "
        "endpoint, for local traffic",
    ),
    IPSetSpec(IPVS_IPS, "hash:ip", "Addresses on the ipvs interface"),
)

IPSET_NAME_MAX = 31  # the kernel's IPSET_MAXNAMELEN, less its terminating NUL


def v6_name(name: str) -> str:
    """The IPv6 proxier's name of a set: upstream's ``KUBE-6-`` prefix, cut to the kernel's
    31 characters as upstream cuts it (KUBE-6-LOAD-BALANCER-SOURCE-CID)."""
    return name.replace("KUBE-", "KUBE-6-", 1)[:IPSET_NAME_MAX]


SPECS_V6 = tuple(IPSetSpec(v6_name(s.name), s.type, s.comment, 6) for s in SPECS_V4)
SPECS = SPECS_V4 + SPECS_V6

BY_NAME = {s.name: s for s in SPECS}
NAMES = frozenset(BY_NAME)  # both families': every set ipvsproxy may own
V6 = {s.name: v6_name(s.name) for s in SPECS_V4}  # an IPv4 set's name -> its IPv6 twin's


def for_family(name: str, family: int) -> str:
    """The name of set ``name`` (an IPv4 set's, as the constants above) for ``family``."""
    return V6[name] if family == 6 else name


def ipvs_ips_set(address: str) -> str:
    """KUBE-IPVS-IPS or its IPv6 twin: the set of the addresses bound to kube-ipvs0 of
    ``address``'s family."""
    return V6[IPVS_IPS] if ":" in address else IPVS_IPS


def names(families: Iterable[int] = (4,)) -> frozenset[str]:
    """The sets of the proxiers of ``families``."""
    wanted = set(families)
    return frozenset(s.name for s in SPECS if s.family in wanted)


def upstream_names(families: Iterable[int] = (4,)) -> frozenset[str]:
    """The sets upstream kube-proxy's IPVS mode creates at every sync, so ipvsproxy creates
    them at its first: every one of ``families`` but KUBE-NO-LOCAL-ENDPOINTS (and its IPv6
    twin), which is created when it first gets a member (a node handed back to kube-proxy
    keeps no set kube-proxy does not know, unless one was used; deploy/README.md says how to
    remove it then)."""
    return names(families) - {NO_LOCAL_ENDPOINTS, V6[NO_LOCAL_ENDPOINTS]}


UPSTREAM_NAMES = upstream_names((4,))

# Where upstream records every NodePort it programs (also those with externalTrafficPolicy
# Local): the port of a TCP or UDP one in a bitmap:port set, node address and port of an SCTP
# one in a hash:ip,port set. ipvsproxy's plan records them the same way.
NODE_PORT_SET = {"TCP": NODE_PORT_TCP, "UDP": NODE_PORT_UDP, "SCTP": NODE_PORT_SCTP}


def node_port_entry(key: ServiceKey) -> str:
    """The entry of ``NODE_PORT_SET[key.protocol]`` that records a NodePort virtual server."""
    if key.protocol == "SCTP":
        return f"{key.address},sctp:{key.port}"
    return str(key.port)


def recorded_node_ports(
    keys: Iterable[ServiceKey], members: Mapping[str, Collection[str]], local: Collection[str]
) -> list[ServiceKey]:
    """The virtual servers among ``keys`` that have the shape of a NodePort's as upstream
    kube-proxy (IPVS mode) or ipvsproxy programs it: on an address of the node (``local``:
    not kube-ipvs0's, not loopback), its protocol and port recorded in the kernel's NodePort
    set of upstream's name (``members``, as read from the kernel). Such a one is a NodePort of
    the proxy the node had before, never someone else's: taking over the node from kube-proxy,
    or a Service deleted while no proxy ran, it is adopted (kept if wanted, else deleted)."""
    return [
        k
        for k in keys
        if k.address in local
        and node_port_entry(k) in members.get(NODE_PORT_SET.get(k.protocol, ""), ())
    ]
