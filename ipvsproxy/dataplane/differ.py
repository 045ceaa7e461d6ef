"""The diff step, pure: which keys a full sync must look at once the kernel's state is known,
and the operations that bring a changed key's kernel state to the desired one."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from itertools import filterfalse

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.desired import Changes, DesiredState
from ipvsproxy.core.diff import (
    AddressOp,
    DestOp,
    MemberOp,
    ServiceOp,
    diff_addresses,
    diff_dests,
    diff_members,
    diff_services,
)
from ipvsproxy.core.virtual_servers import (
    SERVICE_ORDER,
    DestKey,
    Seen,
    ServiceKey,
    VirtualServer,
)
from ipvsproxy.dataplane.observed import Observed


def differing(desired: DesiredState, obs: Observed) -> Changes:
    """The keys whose kernel state a full sync must look at: every one not held as the
    desired object itself. Reading the kernel back compared each of its objects with the
    desired one and kept the desired object where they are the same (``adopt_*``), so a key
    held as that object needs nothing: without drift, a full sync names no key and holds no
    copy of one."""
    want_vs, want_rs = desired.virtual_servers, desired.real_servers
    services = {
        k
        for k, vs in want_vs.items()
        if obs.services.get(k) is not vs or obs.dests.get(k) is not want_rs[k]
    }
    services.update(k for k in obs.services if k not in want_vs)
    return Changes(
        services=services,
        addresses=_either(desired.binds(), obs.bound),
        members={
            n: _either(desired.member_keys(n), obs.members.get(n, set())) for n in ipset_specs.NAMES
        },
        rules=True,
    )


def _either(a: Collection[str], b: Collection[str]) -> set[str]:
    """The entries in just one of ``a`` and ``b``, in a set sized for them (``a ^ b`` is sized
    for all of ``a``)."""
    return set(filterfalse(a.__contains__, b)) | set(filterfalse(b.__contains__, a))


def address_ops(
    desired: DesiredState,
    addresses: set[str],
    bound: set[str],
    owned: Callable[[str], bool],
) -> list[AddressOp]:
    """Binds and unbinds for the changed ``addresses``, against those ``bound`` now."""
    want = {a for a in addresses if desired.is_bound(a)}
    return diff_addresses(want, bound & addresses, owned)


def service_ops(
    desired: DesiredState,
    keys: Collection[ServiceKey],
    services: Mapping[ServiceKey, VirtualServer],
    dests: Mapping[ServiceKey, Mapping[DestKey, Seen]],
    owned: Callable[[ServiceKey], bool],
    expired: Callable[[ServiceKey, Mapping[DestKey, Seen]], set[DestKey]],
) -> list[ServiceOp | DestOp]:
    """Virtual and real server operations for the changed ``keys``, against the kernel's
    ``services`` and ``dests`` (real servers to drain read back with current counts)."""
    ordered = sorted(keys, key=SERVICE_ORDER)
    ops: list[ServiceOp | DestOp] = list(
        diff_services(desired.virtual_servers, services, owned, ordered)
    )
    for key in ordered:
        if key not in desired.virtual_servers:
            continue
        have = dests.get(key, {})
        ops += diff_dests(key, desired.real_servers[key], have, expired(key, have))
    return ops


def member_ops(
    desired: DesiredState, name: str, changed: Collection[str], observed: set[str]
) -> list[MemberOp]:
    """ipset member operations for the ``changed`` entries of set ``name``, against the
    entries the kernel's set holds (``observed``)."""
    entries = set(changed)
    return diff_members(name, desired.members_among(name, entries), observed & entries)
