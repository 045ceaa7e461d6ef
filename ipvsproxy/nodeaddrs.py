"""Which of the node's addresses carry NodePorts (``nodePortAddresses``), and which are local.

Pure: the addresses come in as read from the kernel. Upstream's default is every local address
except loopback, IPv6 link-local and those only on kube-ipvs0; a list of CIDRs narrows it, and
the keyword ``primary`` names the node's primary address (upstream's newer default).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence


class InvalidNodePortAddresses(ValueError):
    """A nodePortAddresses entry that is neither a CIDR nor ``primary``."""


def _usable(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return not (ip.is_loopback or ip.is_link_local) and ip.version == 4


def local_addresses(
    addresses: Iterable[tuple[int, str]], dummy_index: int | None
) -> frozenset[str]:
    """Addresses of every interface but the dummy device (a service IP bound there is not a
    node address, unless another interface has it too)."""
    return frozenset(a for idx, a in addresses if idx != dummy_index and _usable(a))


def node_port_addresses(
    addresses: Iterable[tuple[int, str]],
    dummy_index: int | None,
    node_port_cidrs: Sequence[str] = (),
    primary_ip: str | None = None,
) -> tuple[str, ...]:
    local = local_addresses(addresses, dummy_index)
    if not node_port_cidrs:
        return tuple(sorted(local, key=ipaddress.ip_address))
    nets = []
    chosen: set[str] = set()
    for entry in node_port_cidrs:
        if entry == "primary":
            if primary_ip:
                chosen.add(primary_ip)
            continue
        try:
            nets.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise InvalidNodePortAddresses(
                f"nodePortAddresses: {entry!r} is neither a CIDR nor 'primary'"
            ) from None
    chosen |= {a for a in local if any(ipaddress.ip_address(a) in n for n in nets)}
    return tuple(sorted(chosen, key=ipaddress.ip_address))
