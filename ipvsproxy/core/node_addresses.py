"""Which of the node's addresses carry NodePorts (``nodePortAddresses``), which are local, and
which is the node's IP.

Pure: the addresses come in as read from the kernel, the Node as the API returns it. Upstream's
default is every local address except loopback, IPv6 link-local and those only on kube-ipvs0
(IPv4 link-local ones included); a list of CIDRs narrows a family's, and the keyword ``primary``
names each family's node IP (upstream's newer default) when it is a local address. A family the
list names nothing of keeps every address (upstream's NewNodePortAddresses adds 0.0.0.0/0 or
::/0), as does ``primary`` for a family whose node IP is unknown or loopback
(expandNodePortAddressKeywords skips it). The node IP is upstream's detectNodeIPs:
``bindAddress`` unless unspecified, else the Node's first InternalIP, else its first
ExternalIP.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

# Upstream's node IP when neither bindAddress nor the Node object gives one.
FALLBACK_NODE_IP = "127.0.0.1"


class InvalidNodePortAddresses(ValueError):
    """A nodePortAddresses entry that is neither a CIDR nor ``primary``."""


def _usable(address: str, families: Collection[int]) -> bool:
    """Upstream's isValidForSet: of a family served, neither loopback nor IPv6 link-local."""
    ip = ipaddress.ip_address(address)
    if ip.version not in families or ip.is_loopback:
        return False
    return not (ip.version == 6 and ip.is_link_local)


def _order(address: str) -> tuple[int, int]:
    """IPv4 addresses first, each family in numeric order."""
    ip = ipaddress.ip_address(address)
    return ip.version, int(ip)


def local_addresses(
    addresses: Iterable[tuple[int, str]],
    dummy_index: int | None,
    families: Collection[int] = (4,),
) -> frozenset[str]:
    """Addresses of ``families`` on every interface but the dummy device (a service IP bound
    there is not a node address, unless another interface has it too); never loopback or
    IPv6 link-local."""
    return frozenset(a for idx, a in addresses if idx != dummy_index and _usable(a, families))


def node_port_addresses(
    addresses: Iterable[tuple[int, str]],
    dummy_index: int | None,
    node_port_cidrs: Sequence[str] = (),
    primary_ip: str | None = None,
    families: Collection[int] = (4,),
    primary_ip6: str | None = None,
) -> tuple[str, ...]:
    """The node's addresses that carry NodePorts, IPv4 ones first: of each family, those in
    the family's CIDRs (``primary``: its node IP, when local), or all of them when the list
    names none of that family."""
    local = local_addresses(addresses, dummy_index, families)
    nets: dict[int, list[IPNetwork]] = {4: [], 6: []}
    for entry in node_port_cidrs:
        if entry == "primary":
            for ip in (primary_ip, primary_ip6):
                if ip is not None and not ipaddress.ip_address(ip).is_loopback:
                    net = ipaddress.ip_network(ip)  # a /32 or /128
                    nets[net.version].append(net)
            continue
        try:
            net = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise InvalidNodePortAddresses(
                f"nodePortAddresses: {entry!r} is neither a CIDR nor 'primary'"
            ) from None
        nets[net.version].append(net)
    chosen = []
    for a in local:
        addr = ipaddress.ip_address(a)
        mine = nets[addr.version]
        if not mine or any(addr in n for n in mine):
            chosen.append(a)
    return tuple(sorted(chosen, key=_order))


def node_ip(bind_address: str, node: Mapping[str, Any] | None, family: int = 4) -> str | None:
    """The node IP of ``family`` (upstream's detectNodeIPs): a ``bind_address`` of that family
    that is not unspecified; else the Node's addresses as utilnode.GetNodeHostIPs orders them,
    every InternalIP before every ExternalIP; None when neither gives one (the caller falls
    back to FALLBACK_NODE_IP for IPv4, as upstream)."""
    bind = _ip(bind_address, family)
    if bind is not None and not bind.is_unspecified:
        return str(bind)
    addresses = ((node or {}).get("status") or {}).get("addresses") or []
    for kind in ("InternalIP", "ExternalIP"):
        for entry in addresses:
            if not isinstance(entry, Mapping) or entry.get("type") != kind:
                continue
            ip = _ip(entry.get("address"), family)
            if ip is not None:
                return str(ip)
    return None


def _ip(text: object, family: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not isinstance(text, str):
        return None
    try:
        ip = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    if ip.version != family or (isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped):
        return None
    return ip


def uses_node_addresses(svc: Mapping[str, Any]) -> bool:
    """Whether a Service's plan reads the node's addresses or its IP: NodePorts (which
    addresses carry them), externalIPs and load-balancer VIPs (bound to kube-ipvs0 unless
    already local; the source-range check of the node IP). Others need no re-plan when the
    node's addresses change."""
    spec = svc.get("spec") or {}
    if spec.get("type") in ("NodePort", "LoadBalancer") or spec.get("externalIPs"):
        return True
    ports = spec.get("ports")
    if isinstance(ports, list) and any(isinstance(p, Mapping) and p.get("nodePort") for p in ports):
        return True
    return bool(((svc.get("status") or {}).get("loadBalancer") or {}).get("ingress"))


def pod_cidr(node: Mapping[str, Any] | None, family: int = 4) -> str | None:
    """The Node's pod CIDR of ``family`` (detectLocalMode NodeCIDR): the first of that family
    in ``spec.podCIDRs``, else ``spec.podCIDR``; None when it has none (yet)."""
    spec = (node or {}).get("spec") or {}
    cidrs = spec.get("podCIDRs") or [spec.get("podCIDR")]
    for text in cidrs if isinstance(cidrs, list) else []:
        if not isinstance(text, str):
            continue
        try:
            net = ipaddress.ip_network(text.strip(), strict=False)
        except ValueError:
            continue
        if net.version == family:
            return str(net)
    return None
