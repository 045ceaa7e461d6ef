"""The node's whole desired dataplane, kept as the union of per-Service plans.

Replacing one Service's plan touches only that plan's keys and reports exactly which keys
changed, so an incremental sync compares and writes only those. Addresses and ipset entries are
reference-counted: two Services may share an external IP, and one leaving must not unbind it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from ipvsproxy import ipsets as S
from ipvsproxy.model import DestKey, ServiceKey, VirtualServer
from ipvsproxy.plan import EMPTY, OutFilter, ServicePlan

T = TypeVar("T")


@dataclass
class Changes:
    """Keys whose desired value may differ from before; empty when nothing changed."""

    services: set[ServiceKey] = field(default_factory=set)
    addresses: set[str] = field(default_factory=set)
    # ipset entries by set name (not (name, entry) pairs: a full sync names every member, and
    # a tuple each was ~15 MiB at 10,000 Services on top of the state at its peak)
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


class DesiredState:
    def __init__(self) -> None:
        self.plans: dict[str, ServicePlan] = {}
        self.virtual_servers: dict[ServiceKey, VirtualServer] = {}
        self.real_servers: dict[ServiceKey, Mapping[DestKey, DestKey]] = {}
        self.owner: dict[ServiceKey, str] = {}
        self.bind_refs: Counter[str] = Counter()
        self.member_refs: dict[str, Counter[str]] = {name: Counter() for name in S.NAMES}
        self.out_filter_refs: Counter[OutFilter] = Counter()

    def member_keys(self, set_name: str) -> Collection[str]:
        """The entries ``set_name`` should hold, as held here (no copy)."""
        if set_name == S.IPVS_IPS:
            return self.bind_refs.keys()
        return self.member_refs[set_name].keys()

    def has_member(self, set_name: str, entry: str) -> bool:
        if set_name == S.IPVS_IPS:
            return entry in self.bind_refs
        return entry in self.member_refs[set_name]

    def members_among(self, set_name: str, entries: set[str]) -> set[str]:
        """Those of ``entries`` that ``set_name`` should hold (``has_member`` of each, at once)."""
        refs = self.bind_refs if set_name == S.IPVS_IPS else self.member_refs[set_name]
        return entries & refs.keys()

    def nonempty_sets(self) -> frozenset[str]:
        names = {n for n, c in self.member_refs.items() if c}
        if self.bind_refs:
            names.add(S.IPVS_IPS)
        return frozenset(names)

    def out_filters(self) -> list[OutFilter]:
        return sorted(self.out_filter_refs, key=lambda f: (f.address, f.protocol, f.port))

    def update(self, service: str, plan: ServicePlan) -> Changes:
        """Replace ``service``'s plan; return what changed."""
        old = self.plans.get(service, EMPTY)
        if plan is EMPTY or plan == EMPTY:
            self.plans.pop(service, None)
        else:
            self.plans[service] = plan
        changes = Changes()
        before = self.nonempty_sets()
        self._update_servers(service, old, plan, changes)
        self._update_refs(self.bind_refs, old.bind, plan.bind, changes.addresses)
        for name in set(old.members) | set(plan.members):
            touched: set[str] = set()
            self._update_refs(
                self.member_refs[name],
                old.members.get(name, ()),
                plan.members.get(name, ()),
                touched,
            )
            if touched:
                changes.members[name] = touched
        if changes.addresses:
            changes.members[S.IPVS_IPS] = set(changes.addresses)
        filters: set[OutFilter] = set()
        self._update_refs(self.out_filter_refs, old.out_filters, plan.out_filters, filters)
        changes.rules = bool(filters) or self.nonempty_sets() != before
        return changes

    def _update_servers(
        self, service: str, old: ServicePlan, new: ServicePlan, changes: Changes
    ) -> None:
        for key in old.virtual_servers:
            if key not in new.virtual_servers and self.owner.get(key) == service:
                del self.virtual_servers[key]
                del self.real_servers[key]
                del self.owner[key]
                changes.services.add(key)
        for key, vs in new.virtual_servers.items():
            rs = new.real_servers.get(key, {})
            if self.virtual_servers.get(key) != vs or self.real_servers.get(key) != rs:
                changes.services.add(key)
            # Two Services claiming one virtual server: the later plan wins, as upstream's
            # map iteration would let one of them win.
            self.virtual_servers[key] = vs
            self.real_servers[key] = rs
            self.owner[key] = service

    @staticmethod
    def _update_refs(
        refs: Counter[T], old: Collection[T], new: Collection[T], touched: set[T]
    ) -> None:
        old_set = old if isinstance(old, frozenset | set) else set(old)
        new_set = new if isinstance(new, frozenset | set) else set(new)
        count = refs.get
        for item in old_set - new_set:
            n = count(item, 0) - 1
            if n <= 0:
                refs.pop(item, None)
                touched.add(item)
            else:
                refs[item] = n
        for item in new_set - old_set:
            n = count(item, 0)
            if n == 0:
                touched.add(item)
            refs[item] = n + 1
