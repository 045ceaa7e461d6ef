"""``ipvsproxy cleanup``: remove everything ipvsproxy created on this node, and nothing else.

Ours are the virtual servers the ownership test names (the state file's, those on kube-ipvs0,
none in excludeCIDRs), our iptables chains and the jumps to them, the ipsets of our names, and
the addresses on kube-ipvs0 outside excludeCIDRs; the device itself goes only when nothing
excluded is left on it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.diff import AddressOp, DestOp, OpKind, ServiceOp
from ipvsproxy.core.virtual_servers import ServiceKey

if TYPE_CHECKING:
    from ipvsproxy.dataplane.dataplane import Backends


def remove_ours(
    backends: Backends,
    bound: set[str],
    owns_service: Callable[[ServiceKey], bool],
    owns_address: Callable[[str], bool],
) -> list[str]:
    """Remove our virtual servers, rules, ipsets and addresses (``bound``: those on
    kube-ipvs0), each part on its own; returns why the parts that failed failed."""
    ops: list[ServiceOp | DestOp] = [
        ServiceOp(OpKind.DELETE, vs)
        for key, vs in sorted(backends.ipvs.services().items())
        if owns_service(key)
    ]
    steps: list[Callable[[], object]] = [
        lambda: backends.ipvs.apply(ops),
        backends.iptables.remove,
        lambda: backends.ipsets.destroy(ipset_specs.NAMES & set(backends.ipsets.read())),
        lambda: _remove_addresses(backends, bound, owns_address),
    ]
    errors: list[str] = []
    for step in steps:
        try:
            step()
        except Exception as exc:
            errors.append(str(exc))
    return errors


def _remove_addresses(backends: Backends, bound: set[str], owns: Callable[[str], bool]) -> None:
    """Unbind our addresses; the device goes only if nothing excluded is left on it."""
    ours = [AddressOp(OpKind.DELETE, a) for a in sorted(bound) if owns(a)]
    backends.addresses.apply(ours)
    if len(ours) == len(bound):
        backends.addresses.remove_device()
