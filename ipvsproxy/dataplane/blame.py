"""Which Services an operation that failed fails: the Services that want its object, each
with the keys its retry converges again (``retries.Failures``). An object no Service wants
any more (a deleted Service's leftover) fails under ""."""

from __future__ import annotations

from collections.abc import Iterable

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.desired import Changes, DesiredState
from ipvsproxy.core.diff import AddressOp, DestOp, MemberOp, ServiceOp
from ipvsproxy.core.virtual_servers import ServiceKey
from ipvsproxy.dataplane.batching import refusal
from ipvsproxy.dataplane.retries import Failures
from ipvsproxy.kernel.errors import ApplyError


class Blame:
    """Fails the owners of what failed. One lives for one converge, while the desired state
    does not change: its index of which Services want which address and member is built from
    the desired state once, when first needed (failures are rare)."""

    def __init__(self, desired: DesiredState, failures: Failures) -> None:
        self.desired = desired
        self.failures = failures
        self._owners: dict[tuple[str, str], list[str]] | None = None  # (set, entry) -> Services

    def address(self, op: AddressOp, why: object) -> None:
        ipvs_ips = ipset_specs.ipvs_ips_set(op.address)
        keys = Changes(addresses={op.address}, members={ipvs_ips: {op.address}})
        self._fail(self._owners_of_address(op.address), f"{op}: {why}", keys)

    def member(self, op: MemberOp, why: object) -> None:
        keys = Changes(members={op.set_name: {op.entry}})
        self._fail(self._owners_of_member(op.set_name, op.entry), f"{op}: {why}", keys)

    def service(self, key: ServiceKey, why: str) -> None:
        owner = self.desired.owner.get(key, "")
        self._fail([owner], why, Changes(services={key}))

    def rules(self, set_name: str, why: str, again: bool) -> None:
        """Fail the Services with a member in ``set_name``, whose rules the kernel refuses
        (``again``: also those failed already, whose retry found them refused again)."""
        entries: dict[str, set[str]] = {}
        for entry in self.desired.member_keys(set_name):
            for owner in self._owners_of_member(set_name, entry):
                if owner and (again or owner not in self.failures.by_service):
                    entries.setdefault(owner, set()).add(entry)
        for owner, mine in sorted(entries.items()):
            self.failures.fail(owner, why, Changes(members={set_name: mine}))

    def out_filters(self, why: str, again: bool) -> None:
        """Fail the Services with a KUBE-IPVS-OUT-FILTER rule, which the kernel refuses
        (``again``: also those failed already); their retry converges those virtual servers."""
        for service, plan in sorted(self.desired.plans.items()):
            if plan.out_filters and (again or service not in self.failures.by_service):
                keys = {ServiceKey(f.address, f.protocol, f.port) for f in plan.out_filters}
                self.failures.fail(service, why, Changes(services=keys))

    def refused(self, ops: list[ServiceOp | DestOp], exc: ApplyError) -> None:
        """Fail the Services whose virtual or real servers the kernel refused."""
        for i in sorted(exc.failed):
            op = ops[i]
            key = op.server.key if isinstance(op, ServiceOp) else op.service
            self.service(key, refusal(exc, ops, i))

    def _fail(self, owners: Iterable[str], reason: str, keys: Changes) -> None:
        for owner in owners:
            self.failures.fail(owner, reason, keys)

    def _owners_of_address(self, address: str) -> list[str]:
        """The Services that bind ``address`` ("" for none: a deleted Service's leftover)."""
        return self._owners_of_member(ipset_specs.ipvs_ips_set(address), address)

    def _owners_of_member(self, name: str, entry: str) -> list[str]:
        """The Services that want ``entry`` in set ``name`` ("" for none)."""
        if self._owners is None:
            self._owners = {}
            for service, plan in self.desired.plans.items():
                for address in plan.bind:
                    key = (ipset_specs.ipvs_ips_set(address), address)
                    self._owners.setdefault(key, []).append(service)
                for set_name, entries in plan.members.items():
                    for member in entries:
                        self._owners.setdefault((set_name, member), []).append(service)
        return self._owners.get((name, entry)) or [""]
