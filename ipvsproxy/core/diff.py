"""Compare desired with observed dataplane state and yield the fewest operations that converge.

Pure: the observed state comes in as values (read back from the kernel by a backend), and so do
the facts about time that graceful termination needs, so every decision here is testable
without a kernel.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from enum import StrEnum
from functools import partial
from typing import NamedTuple

from ipvsproxy.core.virtual_servers import (
    DEST_ORDER,
    SERVICE_ORDER,
    DestKey,
    Protocol,
    RealServer,
    RealServerLike,
    Seen,
    ServiceKey,
    VirtualServer,
)


class OpKind(StrEnum):
    ADD = "add"
    SET = "set"
    DELETE = "delete"


# Operations are named tuples: a cold sync makes one per real server, and a tuple is built in
# C (a frozen dataclass's __init__ sets each field through object.__setattr__).


class ServiceOp(NamedTuple):
    kind: OpKind
    server: VirtualServer

    def __str__(self) -> str:
        return f"{self.kind} virtual server {self.server.key}"


class DestOp(NamedTuple):
    kind: OpKind
    service: ServiceKey
    server: RealServerLike

    def __str__(self) -> str:
        return f"{self.kind} real server {self.server.key} of {self.service}"


# A DestOp from a (kind, service, server) tuple, built in C: a named tuple's own __new__ is a
# Python function, and a cold sync makes a DestOp per real server.
new_dest_op = partial(tuple.__new__, DestOp)


class MemberOp(NamedTuple):
    kind: OpKind  # ADD or DELETE
    set_name: str
    entry: str

    def __str__(self) -> str:
        return f"{self.kind} {self.entry} in ipset {self.set_name}"


class AddressOp(NamedTuple):
    kind: OpKind  # ADD or DELETE
    address: str

    def __str__(self) -> str:
        return f"{self.kind} address {self.address}"


def diff_services(
    desired: Mapping[ServiceKey, VirtualServer],
    observed: Mapping[ServiceKey, VirtualServer],
    owned: Callable[[ServiceKey], bool],
    keys: Iterable[ServiceKey] | None = None,
) -> list[ServiceOp]:
    """Virtual server operations; ``keys`` limits the comparison to what changed.

    An observed virtual server that is not desired is deleted only if ``owned`` says it is
    ours: someone else's virtual servers on the same node are never touched.
    """
    ops: list[ServiceOp] = []
    for key in (
        sorted(desired.keys() | observed.keys(), key=SERVICE_ORDER) if keys is None else keys
    ):
        want, have = desired.get(key), observed.get(key)
        if want is not None and have is None:
            ops.append(ServiceOp(OpKind.ADD, want))
        elif want is not None and have is not None and not want.same_settings(have):
            ops.append(ServiceOp(OpKind.SET, want))
        elif want is None and have is not None and owned(key):
            ops.append(ServiceOp(OpKind.DELETE, have))
    return ops


def diff_dests(
    service: ServiceKey,
    desired: Mapping[DestKey, RealServerLike],
    observed: Mapping[DestKey, Seen],
    expired: Collection[DestKey] = (),
) -> list[DestOp]:
    """Real server operations for one virtual server, with graceful termination.

    A TCP real server that is no longer wanted is first set to weight 0, so it keeps its
    established connections and gets no new ones; it is deleted once it has none, or when the
    caller says its grace period ``expired``. UDP and SCTP real servers go at once, as
    upstream's (IsRsGracefulTerminationNeeded; the caller clears UDP conntrack entries).
    """
    if not observed:
        # A new virtual server (all of them, in a cold sync): every real server is added, in
        # the order of their keys (a DestKey sorts as its (address, port), compared in C).
        add = OpKind.ADD
        return [new_dest_op((add, service, desired[key])) for key in sorted(desired)]
    ops: list[DestOp] = []
    for key in sorted(desired.keys() | observed.keys(), key=DEST_ORDER):
        want, have = desired.get(key), observed.get(key)
        if want is not None:
            if have is None:
                ops.append(DestOp(OpKind.ADD, service, want))
            elif not want.same_settings(have.server):
                ops.append(DestOp(OpKind.SET, service, want))
            continue
        assert have is not None
        if service.protocol is not Protocol.TCP or have.stats.idle or key in expired:
            ops.append(DestOp(OpKind.DELETE, service, have.server))
        elif have.server.weight != 0:
            drained = RealServer(key, weight=0, fwd_method=have.server.fwd_method)
            ops.append(DestOp(OpKind.SET, service, drained))
    return ops


def adopt_dests(
    desired: Mapping[DestKey, RealServerLike], observed: Mapping[DestKey, Seen]
) -> Mapping[DestKey, Seen]:
    """What a full sync keeps of the real servers it read back from one virtual server.

    One that is already as desired is held as the desired object itself rather than as the
    kernel's copy with its connection counts, so a full sync holds no second copy of the real
    servers the kernel has as desired. When all are, the desired mapping itself is kept
    (read-only: whoever changes it copies it first). Nothing is lost: counts matter only for
    a real server that is no longer desired (draining), and such a one keeps its copy here,
    and is read again before any later drain decision.
    """
    kept: dict[DestKey, Seen] = {}
    as_desired = 0
    for key, have in observed.items():
        want = desired.get(key)
        if want is not None and want.same_settings(have.server):
            kept[want.key] = want
            as_desired += 1
        else:
            kept[key] = have
    if as_desired == len(kept) == len(desired):
        return desired
    return kept


def adopt_services(
    desired: Mapping[ServiceKey, VirtualServer], observed: Iterable[VirtualServer]
) -> dict[ServiceKey, VirtualServer]:
    """The virtual servers a full sync reads back, those as desired held as the desired
    objects (see ``adopt_dests``), taken one at a time as they are read: neither the kernel's
    copies nor a list of them all is held until the next full sync."""
    kept: dict[ServiceKey, VirtualServer] = {}
    for have in observed:
        want = desired.get(have.key)
        if want is not None and want.same_settings(have):
            kept[want.key] = want
        else:
            kept[have.key] = have
    return kept


def adopt_members(desired: Collection[str], observed: set[str]) -> set[str]:
    """The entries of an ipset (or the addresses bound) a full sync read back, as the desired
    strings where they are desired, the kernel's otherwise: no second string is kept for a
    member that is as desired."""
    if not observed:
        return set()
    kept = {e for e in desired if e in observed}
    if len(kept) < len(observed):
        kept |= observed - kept
    return kept


def adopt_member_parts(
    desired: Callable[[str], Collection[str]], parts: Iterable[tuple[str, list[str]]]
) -> dict[str, set[str]]:
    """``adopt_members`` of every set, as a dump reads them (set name, some of its entries):
    the entries each part holds are let go as soon as they are adopted, so the kernel's fresh
    strings of one part at most are held at a time, never every set's."""
    kept: dict[str, set[str]] = {}
    name: str | None = None
    canonical: dict[str, str] = {}
    for set_name, entries in parts:
        if set_name != name:  # a set's parts come in a row
            name = set_name
            canonical = {e: e for e in desired(set_name)}
        target = kept.setdefault(set_name, set())
        target.update([canonical.get(e, e) for e in entries])
    return kept


def diff_members(
    set_name: str, desired: Collection[str], observed: Collection[str]
) -> list[MemberOp]:
    ops = [MemberOp(OpKind.ADD, set_name, e) for e in sorted(set(desired) - set(observed))]
    ops += [MemberOp(OpKind.DELETE, set_name, e) for e in sorted(set(observed) - set(desired))]
    return ops


def diff_addresses(
    desired: Collection[str], observed: Collection[str], owned: Callable[[str], bool]
) -> list[AddressOp]:
    ops = [AddressOp(OpKind.ADD, a) for a in sorted(set(desired) - set(observed))]
    ops += [AddressOp(OpKind.DELETE, a) for a in sorted(set(observed) - set(desired)) if owned(a)]
    return ops
