"""The node's whole desired dataplane, kept as the union of per-Service plans.

Replacing one Service's plan touches only that plan's keys and reports exactly which keys
changed, so an incremental sync compares and writes only those. Addresses and ipset entries are
reference-counted: two Services may share an external IP, and one leaving must not unbind it.

A virtual server (address, protocol, port) belongs to one Service. When several claim one (a
newer Service's externalIPs equal to an older one's ClusterIP: the CVE-2020-8554 class), the
Service that had it first keeps it, by creationTimestamp then namespace/name; the others' plans
are applied without it (their virtual server, its ipset entries and out-filter), and they are
reported. Whichever Service is left owns the virtual server exactly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.identities import ServiceIdentity
from ipvsproxy.core.plan import EMPTY, OutFilter, ServicePlan
from ipvsproxy.core.virtual_servers import DestKey, ServiceKey, VirtualServer

T = TypeVar("T")


@dataclass
class Changes:
    """Keys whose desired value may differ from before; empty when nothing changed."""

    services: set[ServiceKey] = field(default_factory=set)
    addresses: set[str] = field(default_factory=set)
    # ipset entries by set name (not (name, entry) pairs: a full sync names every member, and
    # holds no object per member beyond the entry string the desired state already has)
    members: dict[str, set[str]] = field(default_factory=dict)
    rules: bool = False

    def __bool__(self) -> bool:
        return bool(self.services or self.addresses or any(self.members.values()) or self.rules)

    def merge(self, other: Changes) -> None:
        self.services |= other.services
        self.addresses |= other.addresses
        for name, entries in other.members.items():
            mine = self.members.get(name)
            if mine is None:
                self.members[name] = set(entries)
            else:
                mine |= entries
        self.rules = self.rules or other.rules


_IPVS_IPS6 = ipset_specs.V6[ipset_specs.IPVS_IPS]


class DesiredState:
    """Every Service's plan, and their union: what the differ compares the kernel with.

    Owns each Service's plan as planned (``plans``) and, for a Service that lost a contested
    virtual server, its plan as applied (``applied``) and what it lost (``lost``); the union
    of the plans as applied (``virtual_servers``, ``real_servers``, ``owner``); and reference
    counts of bound addresses (``bind_refs``, which are also KUBE-IPVS-IPS's members), of
    every other set's entries (``member_refs``) and of out-filters. Pure: no I/O.

    Invariants, after every ``update``:
    - every key of ``virtual_servers`` has one owner (``owner``): the claimant with the
      earliest creationTimestamp (none: last), then namespace/name; its value and its real
      servers are the owner's, and ``contested`` names every claimant of a key claimed more
      than once;
    - a count is the number of applied plans that hold the address, entry or out-filter, and
      an item is present exactly while its count is positive;
    - ``update`` reports in its ``Changes`` the keys whose desired value it changed, so an
      incremental sync compares and writes only those;
    - the real-server mappings are the plans' own read-only ones, shared, never copied.
    """

    def __init__(self) -> None:
        self.plans: dict[str, ServicePlan] = {}  # each Service's plan, as planned
        # A Service that lost a virtual server to another: its plan as applied (without it).
        # Every other Service's plan is applied as planned.
        self.applied: dict[str, ServicePlan] = {}
        self.lost: dict[str, tuple[ServiceKey, ...]] = {}  # those Services: what they lost
        self.virtual_servers: dict[ServiceKey, VirtualServer] = {}
        self.real_servers: dict[ServiceKey, Mapping[DestKey, DestKey]] = {}
        self.owner: dict[ServiceKey, str] = {}  # every virtual server's one Service
        # Virtual servers more than one Service claims: every claimant (the owner among them).
        self.contested: dict[ServiceKey, set[str]] = {}
        self.moved: set[str] = set()  # other Services the last update took or gave keys
        self.bind_refs: Counter[str] = Counter()  # IPv4 binds: KUBE-IPVS-IPS's members
        self.bind_refs6: Counter[str] = Counter()  # IPv6 ones: KUBE-6-IPVS-IPS's
        self.member_refs: dict[str, Counter[str]] = {name: Counter() for name in ipset_specs.NAMES}
        self.out_filter_refs: Counter[OutFilter] = Counter()

    def _refs(self, set_name: str) -> Counter[str]:
        if set_name == ipset_specs.IPVS_IPS:
            return self.bind_refs
        if set_name == _IPVS_IPS6:
            return self.bind_refs6
        return self.member_refs[set_name]

    def member_keys(self, set_name: str) -> Collection[str]:
        """The entries ``set_name`` should hold, as held here (no copy)."""
        return self._refs(set_name).keys()

    def has_member(self, set_name: str, entry: str) -> bool:
        return entry in self._refs(set_name)

    def members_among(self, set_name: str, entries: set[str]) -> set[str]:
        """Those of ``entries`` that ``set_name`` should hold (``has_member`` of each, at once)."""
        return entries & self._refs(set_name).keys()

    def binds(self) -> Collection[str]:
        """Every address to bind to kube-ipvs0, both families (no copy without IPv6 ones)."""
        if not self.bind_refs6:
            return self.bind_refs.keys()
        return self.bind_refs.keys() | self.bind_refs6.keys()

    def is_bound(self, address: str) -> bool:
        return address in self.bind_refs or address in self.bind_refs6

    def nonempty_sets(self) -> frozenset[str]:
        names = {n for n, c in self.member_refs.items() if c}
        if self.bind_refs:
            names.add(ipset_specs.IPVS_IPS)
        if self.bind_refs6:
            names.add(_IPVS_IPS6)
        return frozenset(names)

    def out_filters(self) -> list[OutFilter]:
        return sorted(self.out_filter_refs, key=lambda f: (f.address, f.protocol, f.port))

    def update(self, service: str, plan: ServicePlan) -> Changes:
        """Replace ``service``'s plan; return what changed. ``moved`` names the other
        Services whose share changed with it (a virtual server taken or given back)."""
        old = self.plans.get(service, EMPTY)
        old_applied = self.applied.pop(service, old)
        if plan is EMPTY or plan == EMPTY:
            self.plans.pop(service, None)
        else:
            self.plans[service] = plan
        moved: set[str] = set()
        for key in old.virtual_servers:
            if key not in plan.virtual_servers:
                self._release(key, service, moved)
        for key in plan.virtual_servers:
            self._claim(key, service, moved)
        moved.discard(service)
        self.moved = moved
        changes = Changes()
        before = self.nonempty_sets()
        filters: set[OutFilter] = set()
        self._apply(service, old_applied, self._effective(service), changes, filters)
        for other in sorted(moved):
            was = self.applied.pop(other, self.plans[other])
            self._apply(other, was, self._effective(other), changes, filters)
        changes.rules = bool(filters) or self.nonempty_sets() != before
        return changes

    def conflicts(self, service: str) -> list[str]:
        """Why ``service`` is not programmed at some of its virtual servers."""
        return [
            f"service {service}: {key} is service {self.owner.get(key)}'s, which had it first;"
            " not programmed for this one"
            for key in self.lost.get(service, ())
        ]

    # -- who owns a virtual server -----------------------------------------------------------

    def _rank(self, service: str) -> tuple[bool, str, str]:
        """Earlier first: by creationTimestamp (none: last), then namespace/name."""
        created = self.plans[service].created
        return (not created, created, service)

    def _claim(self, key: ServiceKey, service: str, moved: set[str]) -> None:
        owner = self.owner.get(key)
        if owner is None:
            self.owner[key] = service
            return
        if owner == service and key not in self.contested:
            return
        claimants = self.contested.setdefault(key, {owner})
        claimants.add(service)
        first = min(claimants, key=self._rank)
        if first != owner:
            self.owner[key] = first
            moved.update((owner, first))

    def _release(self, key: ServiceKey, service: str, moved: set[str]) -> None:
        claimants = self.contested.get(key)
        if claimants is None:
            if self.owner.get(key) == service:
                del self.owner[key]
            return
        claimants.discard(service)
        first = min(claimants, key=self._rank)
        if len(claimants) == 1:
            del self.contested[key]
        if self.owner.get(key) != first:
            self.owner[key] = first
            moved.add(first)

    def _effective(self, service: str) -> ServicePlan:
        """``service``'s plan as applied: without the virtual servers another Service owns."""
        plan = self.plans.get(service, EMPTY)
        self.lost.pop(service, None)
        lost = tuple(k for k in plan.virtual_servers if self.owner.get(k) != service)
        if not lost:
            return plan
        self.lost[service] = lost
        self.applied[service] = applied = _without(plan, lost)
        return applied

    # -- applying a plan's share -------------------------------------------------------------

    def _apply(
        self,
        service: str,
        old: ServicePlan,
        plan: ServicePlan,
        changes: Changes,
        filters: set[OutFilter],
    ) -> None:
        self._update_servers(old, plan, changes)
        self._update_binds(old.bind, plan.bind, changes.addresses)
        for name in set(old.members) | set(plan.members):
            touched: set[str] = set()
            self._update_refs(
                self.member_refs[name],
                old.members.get(name, ()),
                plan.members.get(name, ()),
                touched,
            )
            if touched:
                mine = changes.members.get(name)
                if mine is None:
                    changes.members[name] = touched
                else:
                    mine |= touched
        for address in changes.addresses:
            changes.members.setdefault(ipset_specs.ipvs_ips_set(address), set()).add(address)
        self._update_refs(self.out_filter_refs, old.out_filters, plan.out_filters, filters)

    def _update_binds(self, old: frozenset[str], new: frozenset[str], touched: set[str]) -> None:
        """Each family's binds counted apart (a plan of IPv4 addresses only, most of them, in
        one pass)."""
        if not any(":" in a for a in old) and not any(":" in a for a in new):
            self._update_refs(self.bind_refs, old, new, touched)
            return
        for refs, v6 in ((self.bind_refs, False), (self.bind_refs6, True)):
            mine_old = frozenset(a for a in old if (":" in a) == v6)
            mine_new = frozenset(a for a in new if (":" in a) == v6)
            self._update_refs(refs, mine_old, mine_new, touched)

    def _update_servers(self, old: ServicePlan, new: ServicePlan, changes: Changes) -> None:
        """Both plans as applied: every virtual server of ``new`` is its Service's own."""
        for key in old.virtual_servers:
            if key not in new.virtual_servers and key not in self.owner:
                del self.virtual_servers[key]
                del self.real_servers[key]
                changes.services.add(key)
            # (a key another Service owns now is replaced by that Service's share)
        for key, vs in new.virtual_servers.items():
            rs = new.real_servers.get(key, {})
            if self.virtual_servers.get(key) != vs or self.real_servers.get(key) != rs:
                changes.services.add(key)
            self.virtual_servers[key] = vs
            self.real_servers[key] = rs

    @staticmethod
    def _update_refs(
        refs: Counter[T], old: Collection[T], new: Collection[T], touched: set[T]
    ) -> None:
        new_set = new if isinstance(new, (frozenset, set)) else set(new)
        count = refs.get
        if old:
            old_set = old if isinstance(old, (frozenset, set)) else set(old)
            for item in old_set - new_set:
                n = count(item, 0) - 1
                if n <= 0:
                    refs.pop(item, None)
                    touched.add(item)
                else:
                    refs[item] = n
            new_set = new_set - old_set
        for item in new_set:
            n = count(item, 0)
            if n == 0:
                touched.add(item)
            refs[item] = n + 1


def _without(plan: ServicePlan, lost: Collection[ServiceKey]) -> ServicePlan:
    """``plan`` without the virtual servers ``lost``, nor their ipset entries (those that start
    with the virtual server's ``address,protocol:port``) and out-filters. Addresses stay bound:
    they are reference-counted and shared by design."""
    gone = set(lost)
    heads = tuple(f"{k.address},{k.protocol.value.lower()}:{k.port}" for k in gone)

    def kept(entry: str) -> bool:
        return not any(entry == h or entry.startswith(h + ",") for h in heads)

    members = {name: frozenset(filter(kept, entries)) for name, entries in plan.members.items()}
    names = plan.identity
    return replace(
        plan,
        identity=ServiceIdentity.of(
            {k: v for k, v in names.virtual_servers.items() if k not in gone}, names.endpoints
        ),
        virtual_servers={k: v for k, v in plan.virtual_servers.items() if k not in gone},
        real_servers={k: v for k, v in plan.real_servers.items() if k not in gone},
        members={name: entries for name, entries in members.items() if entries},
        out_filters=frozenset(
            f for f in plan.out_filters if ServiceKey(f.address, f.protocol, f.port) not in gone
        ),
    )
