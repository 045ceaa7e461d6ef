"""What the kernel holds of ours: the observed cache, how it is read (whole at a full sync, the
keys of a retry otherwise), which of the kernel's virtual servers are ours (adoption), and how
every successful write keeps the cache current.

Where the kernel holds an object exactly as desired, the cache holds the desired object itself,
not a copy: a full sync finds such a key in agreement by identity (``differ.differing``), and
the cache costs no memory for it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.desired import Changes, DesiredState
from ipvsproxy.core.diff import (
    DestOp,
    OpKind,
    ServiceOp,
    adopt_dests,
    adopt_member_parts,
    adopt_members,
    adopt_services,
)
from ipvsproxy.core.node_addresses import local_addresses
from ipvsproxy.core.ruleset import ChainKey
from ipvsproxy.core.virtual_servers import (
    IDLE,
    DestKey,
    ObservedDest,
    Protocol,
    RealServerLike,
    Seen,
    ServiceKey,
    VirtualServer,
)
from ipvsproxy.dataplane.statefile import State

if TYPE_CHECKING:
    from ipvsproxy.dataplane.dataplane import Backends

log = logging.getLogger("ipvsproxy")

_T = TypeVar("_T")

# ``what`` fails (the message) or works again (None): a kernel problem, reported once.
Problem = Callable[[str, str | None], None]


@dataclass
class Observed:
    """The cache of what the kernel holds of ours; kept current by every successful write."""

    services: dict[ServiceKey, VirtualServer]
    # A virtual server's real servers: often the desired mapping itself (read-only), when the
    # kernel holds exactly that; ``record_ipvs`` copies it before changing it.
    dests: dict[ServiceKey, Mapping[DestKey, Seen]]
    bound: set[str]
    members: dict[str, set[str]]  # the sets of ours that exist, with their members
    rules_text: str | None
    # Parts whose read failed ("ipvs", "addresses", "ipsets"): a sync leaves them alone and
    # the next sync is a full one, which reads them again.
    unread: frozenset[str] = frozenset()
    # Each of our chains' digest (``ruleset.chain_digest``) as the kernel held it once
    # ``rules_text`` was written or found written; empty while that is unknown.
    chains: Mapping[ChainKey, str] = field(default_factory=dict)


def read_kernel(
    backends: Backends,
    desired: DesiredState,
    state: State,
    *,
    excluded: Callable[[str], bool],
    render_rules: Callable[[Collection[str] | None], str],
    problem: Problem,
    families: tuple[int, ...] = (4,),
) -> Observed:
    """What the kernel holds, held as the desired objects where it is as desired. A part
    whose read fails is reported and left out (``unread``); the others are read. The sets of
    ``families`` that are missing are created. ``render_rules`` renders the rules for the
    sets that exist (None: unknown)."""
    unread: set[str] = set()

    def read(part: str, what: str, fn: Callable[[], _T], default: _T) -> _T:
        if part in unread:
            return default
        try:
            value = fn()
        except Exception as exc:
            unread.add(part)
            problem(part, f"reading {what}: {type(exc).__name__}: {exc}")
            return default
        problem(part, None)
        return value

    want_vs, want_rs = desired.virtual_servers, desired.real_servers
    no_services: dict[ServiceKey, VirtualServer] = {}
    services = read(
        "ipvs",
        "IPVS",
        lambda: adopt_services(want_vs, backends.ipvs.each_service()),
        no_services,
    )
    no_addresses: set[str] = set()
    bound = read(
        "addresses",
        "kube-ipvs0",
        lambda: adopt_members(desired.binds(), backends.addresses.bound()),
        no_addresses,
    )
    # Read before anything is written: the NodePort sets as the node's previous proxy
    # left them tell its NodePort virtual servers (``adopt_ours``).
    members: dict[str, set[str]] = read(
        "ipsets",
        "ipsets",
        lambda: adopt_member_parts(desired.member_keys, backends.ipsets.each_part()),
        {},
    )
    no_local: frozenset[str] = frozenset()
    adopt_ours(
        state,
        desired,
        services,
        bound,
        members,
        lambda what: read("addresses", what, lambda: _node_addresses(backends), no_local),
        excluded,
    )
    watched = sorted(
        k for k in services if k in want_vs or k in state.virtual_servers or k.address in bound
    )
    dests: dict[ServiceKey, Mapping[DestKey, Seen]] = read(
        "ipvs",
        "IPVS",
        lambda: {k: adopt_dests(want_rs.get(k, {}), backends.ipvs.dests(k)) for k in watched},
        {},
    )
    if "ipsets" not in unread:
        ensure_sets(backends, members, problem, families)
    unknown: tuple[str | None, Mapping[ChainKey, str]] = (None, {})
    existing = None if "ipsets" in unread else members.keys()
    rules_text, chains = read(
        "iptables",
        "iptables",
        lambda: same_rules(backends, lambda: render_rules(existing), state),
        unknown,
    )
    unread.discard("iptables")
    return Observed(services, dests, bound, members, rules_text, frozenset(unread), chains)


def reread(obs: Observed, keys: Changes, backends: Backends) -> None:
    """Read back what the kernel holds for ``keys`` only (a retry after a failure, whose
    outcome may be unknown), into the cache."""
    if keys.services:
        kernel = backends.ipvs.services()
        for key in keys.services:
            if key in kernel:
                obs.services[key] = kernel[key]
                obs.dests[key] = backends.ipvs.dests(key)
            else:
                obs.services.pop(key, None)
                obs.dests.pop(key, None)
    if keys.addresses:
        bound = backends.addresses.bound()
        for address in keys.addresses:
            (obs.bound.add if address in bound else obs.bound.discard)(address)
    if any(keys.members.values()):
        sets = backends.ipsets.read()
        for name, entries in keys.members.items():
            have = obs.members.setdefault(name, set())
            for entry in entries:
                (have.add if entry in sets.get(name, ()) else have.discard)(entry)


def ensure_sets(
    backends: Backends,
    members: dict[str, set[str]],
    problem: Problem,
    families: tuple[int, ...] = (4,),
) -> None:
    """Create our sets of ``families`` that are missing, one at a time: one the kernel cannot
    create (a set type it lacks) is reported and stays out of ``members``; its members then
    fail the Services that want them."""
    for name in sorted(ipset_specs.upstream_names(families) - members.keys()):
        try:
            backends.ipsets.ensure(members.keys(), [name])
        except Exception as exc:
            problem(name, f"creating ipset {name}: {exc}")
            continue
        problem(name, None)
        members[name] = set()


def adopt_ours(
    state: State,
    desired: DesiredState,
    services: Collection[ServiceKey],
    bound: Collection[str],
    members: Mapping[str, Collection[str]],
    read_local: Callable[[str], Collection[str]],
    excluded: Callable[[str], bool],
) -> None:
    """Ours, of the kernel's virtual ``services`` (into ``state.virtual_servers``): those the
    state file names (keys recorded before a write that never happened go), those the
    Services want (their real servers are programmed as ours anyway; a lost or unreadable
    state file, or a node taken over from kube-proxy, must not leave them behind once
    unwanted), and those on a node address whose port the kernel's NodePort set of
    upstream's name records (``ipset_specs.recorded_node_ports``: kube-proxy's NodePorts on a node
    taken over, also of Services deleted meanwhile). Those on kube-ipvs0 are ours by the
    device. Nothing in ``excluded`` is ours."""
    ours, want = state.virtual_servers, desired.virtual_servers
    ours.intersection_update(services)
    ours.update(k for k in want if k in services and not excluded(k.address))
    others = [
        k for k in services if k not in ours and k.address not in bound and not excluded(k.address)
    ]
    if not others or not any(members.get(n) for n in ipset_specs.NODE_PORT_SET.values()):
        return
    found = ipset_specs.recorded_node_ports(others, members, read_local("node addresses"))
    if found:
        log.info(
            "adopting %d NodePort virtual servers on node addresses that the NodePort "
            "ipsets record (the node's previous proxy's): %s",
            len(found),
            ", ".join(f"{k.protocol} {k.address}:{k.port}" for k in sorted(found)),
        )
        ours.update(found)


def adopt_recorded(
    state: State,
    desired: DesiredState,
    backends: Backends,
    bound: Collection[str],
    excluded: Callable[[str], bool],
) -> None:
    """``adopt_ours`` as ``cleanup`` needs it: the state file may not name a NodePort virtual
    server of ours (lost, unreadable, never written), the NodePort sets still record it."""
    members = {
        name: entries
        for name, entries in backends.ipsets.read().items()
        if name in ipset_specs.NODE_PORT_SET.values()
    }
    services = backends.ipvs.services()
    adopt_ours(
        state, desired, services, bound, members, lambda _: _node_addresses(backends), excluded
    )


def _node_addresses(backends: Backends) -> frozenset[str]:
    """The node's addresses but kube-ipvs0's and loopback (upstream's nodeAddressSet)."""
    return local_addresses(backends.addresses.indexed(), backends.addresses.device_index())


def same_rules(
    backends: Backends, render: Callable[[], str], state: State
) -> tuple[str | None, Mapping[ChainKey, str]]:
    """The rendered rules and our chains' digests if our chains are as we last wrote them
    (same rendering, same kernel copy, jumps in place), else (None, {}): they are written at
    this sync."""
    ipt = backends.iptables.read()
    text = render()
    same = (
        not ipt.missing_jumps
        and hashlib.sha256(text.encode()).hexdigest() == state.rules_digest
        and ipt.fingerprint == state.iptables_fingerprint
    )
    return (text, ipt.chains) if same else (None, {})


def record_ipvs(
    ops: list[ServiceOp | DestOp],
    obs: Observed,
    state: State,
    desired: DesiredState,
    now: float,
    udp_removed: dict[ServiceKey, set[DestKey]],
) -> None:
    """Fold applied IPVS operations into the cache and the state file's bookkeeping: which
    virtual servers are ours, which real servers drain since when (from ``now``). The
    real servers removed from a UDP virtual server go to ``udp_removed``, whose
    stale flows are flushed at the sync's end."""
    draining = state.draining_since
    # Real server operations come grouped by virtual server: look its maps up once a group.
    service: ServiceKey | None = None
    dests: dict[DestKey, Seen] = {}
    want: Mapping[DestKey, RealServerLike] = {}
    touched: list[ServiceKey] = []
    gone: set[DestKey] | None = None  # a UDP virtual server's real servers removed
    delete = OpKind.DELETE
    for op in ops:
        if isinstance(op, ServiceOp):
            key = op.server.key
            if op.kind is delete:
                obs.services.pop(key, None)
                obs.dests.pop(key, None)
                state.virtual_servers.discard(key)
            else:
                obs.services[key] = op.server
                obs.dests.setdefault(key, {})
                state.virtual_servers.add(key)
            service = None  # its real servers' map may have gone
            continue
        if op.service is not service:
            service = op.service
            dests = _own_copy(obs.dests, service)
            want = desired.real_servers.get(service, {})
            touched.append(service)
            gone = None
            if service.protocol is Protocol.UDP:  # its stale flows go at the sync's end
                gone = udp_removed.setdefault(service, set())
        server = op.server
        dest = server if type(server) is DestKey else server.key
        if op.kind is delete:
            dests.pop(dest, None)
            draining.pop((service, dest), None)
            if gone is not None:
                gone.add(dest)
            continue
        old = dests.get(dest) if dests else None
        if old is None or old.stats is IDLE:
            dests[dest] = server
        else:
            dests[dest] = ObservedDest(server, old.stats)
        if dest in want:
            if draining:
                draining.pop((service, dest), None)
        else:
            draining.setdefault((service, dest), now)
    _share_desired(obs.dests, desired.real_servers, touched)


def _own_copy(
    dests: dict[ServiceKey, Mapping[DestKey, Seen]], service: ServiceKey
) -> dict[DestKey, Seen]:
    """``service``'s observed real servers as a dict of the cache's own, to change in place
    (copied if the cache shares the desired mapping)."""
    have = dests.get(service)
    if type(have) is not dict:
        have = dests[service] = dict(have or {})
    return have


def _share_desired(
    dests: dict[ServiceKey, Mapping[DestKey, Seen]],
    desired: Mapping[ServiceKey, Mapping[DestKey, DestKey]],
    services: Iterable[ServiceKey],
) -> None:
    """Where the kernel now holds exactly the desired real servers, the cache holds the
    desired mapping instead of its own copy: the cache holds no copy equal to a mapping the
    desired state holds already."""
    for service in services:
        want, have = desired.get(service), dests.get(service)
        if want is not None and have is not None and have is not want and have == want:
            dests[service] = want
