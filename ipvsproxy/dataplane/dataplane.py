"""The dataplane: plans Services, diffs them against what the kernel holds, applies the
difference through the backends.

Two ways to converge. ``sync()`` applies only what changed since the last sync, against a cache
of the kernel that every successful write keeps current: a change costs work in proportion to
the change. ``reconcile()`` reads the kernel back and compares everything: it repairs drift,
adopts what a previous run programmed, and writes nothing when nothing differs.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import filterfalse
from pathlib import Path
from typing import Any, TypeVar

from ipvsproxy.core import ipset_specs
from ipvsproxy.core import ruleset as rules
from ipvsproxy.core.desired import Changes, DesiredState
from ipvsproxy.core.diff import (
    AddressOp,
    DestOp,
    MemberOp,
    OpKind,
    ServiceOp,
    adopt_dests,
    adopt_member_parts,
    adopt_members,
    adopt_services,
    diff_addresses,
    diff_dests,
    diff_members,
    diff_services,
)
from ipvsproxy.core.node_addresses import local_addresses
from ipvsproxy.core.plan import EMPTY, NodeFacts, PlanConfig, ServicePlan, plan_service
from ipvsproxy.core.virtual_servers import (
    IDLE,
    SERVICE_ORDER,
    DestKey,
    ObservedDest,
    Protocol,
    RealServerLike,
    Seen,
    ServiceKey,
    VirtualServer,
)
from ipvsproxy.dataplane.retries import Failure, Failures
from ipvsproxy.dataplane.snapshot import Snapshot
from ipvsproxy.dataplane.statefile import State, StateFile
from ipvsproxy.kernel.addresses import Addresses
from ipvsproxy.kernel.conntrack import Conntrack
from ipvsproxy.kernel.errors import ApplyError, Rejected
from ipvsproxy.kernel.ipset import IPSets
from ipvsproxy.kernel.iptables import IPTables
from ipvsproxy.kernel.ipvs import IPVS
from ipvsproxy.kernel.sysctl import Sysctls, required

log = logging.getLogger("ipvsproxy")

DEFAULT_GRACE_SECONDS = 15 * 60
DEFAULT_PLAN_CONFIG = PlanConfig()
DEFAULT_RULES_CONFIG = rules.RulesConfig()


@dataclass
class Backends:
    ipvs: IPVS
    addresses: Addresses
    ipsets: IPSets
    iptables: IPTables
    conntrack: Conntrack
    sysctls: Sysctls

    @classmethod
    def open(cls) -> Backends:
        return cls(IPVS(), Addresses(), IPSets(), IPTables(), Conntrack(), Sysctls())

    def close(self) -> None:
        self.ipvs.close()
        self.addresses.close()
        self.ipsets.close()
        self.conntrack.close()

    def each(self) -> tuple[IPVS, Addresses, IPSets, IPTables, Conntrack, Sysctls]:
        return (self.ipvs, self.addresses, self.ipsets, self.iptables, self.conntrack, self.sysctls)

    def writes(self) -> int:
        return sum(b.counters.writes for b in self.each())


@dataclass
class SyncResult:
    full: bool
    writes: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    sysctls_set: list[str] = field(default_factory=list)  # kernel settings this sync changed
    failed: dict[str, str] = field(default_factory=dict)  # Services that failed, and why
    # The sync ran to its end: upstream's proxier marks itself updated (healthy) then. Only
    # rules that could not be written stop that, as upstream's failed iptables-restore does.
    complete: bool = True


@dataclass
class _Observed:
    """The cache of what the kernel holds of ours; kept current by every successful write."""

    services: dict[ServiceKey, VirtualServer]
    # A virtual server's real servers: often the desired mapping itself (read-only), when the
    # kernel holds exactly that; ``_record`` copies it before changing it.
    dests: dict[ServiceKey, Mapping[DestKey, Seen]]
    bound: set[str]
    members: dict[str, set[str]]  # the sets of ours that exist, with their members
    rules_text: str | None
    # Parts whose read failed ("ipvs", "addresses", "ipsets"): a sync leaves them alone and
    # the next sync is a full one, which reads them again.
    unread: frozenset[str] = frozenset()


class Dataplane:
    def __init__(
        self,
        node: NodeFacts,
        backends: Backends,
        state_path: Path,
        plan_config: PlanConfig = DEFAULT_PLAN_CONFIG,
        rules_config: rules.RulesConfig = DEFAULT_RULES_CONFIG,
        exclude_cidrs: Iterable[str] = (),
        grace_seconds: float = DEFAULT_GRACE_SECONDS,
        clock: Callable[[], float] = time.time,
        strict_arp: bool = False,
        retry_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.strict_arp = strict_arp
        self.node = node
        self.backends = backends
        self.plan_config = plan_config
        self.rules_config = rules_config
        self.exclude = [ipaddress.ip_network(c, strict=False) for c in exclude_cidrs]
        self.grace_seconds = grace_seconds
        self.clock = clock
        self.desired = DesiredState()
        self.pending = Changes()
        # service -> why it cannot be programmed, or what of it was left out (and why)
        self.errors: dict[str, str] = {}
        self.invalid: dict[str, str] = {}  # service -> why its current spec cannot be planned
        # Services whose report an update of another Service changed (it took a virtual server
        # from them): what ``errors`` says of them, for an Event (the daemon takes them).
        self.notices: dict[str, str] = {}
        # service -> its last spec that could be planned (the informer's object, not a copy)
        self.last_good: dict[str, Mapping[str, Any]] = {}
        self.statefile = StateFile(state_path)
        self.state: State = self.statefile.open()
        if self.statefile.unreadable:
            log.warning(
                "%s; falling back to what the kernel shows is ours: virtual servers on "
                "addresses bound to kube-ipvs0 and those the Services want; virtual servers "
                "on node addresses (NodePorts) of Services deleted meanwhile may stay",
                self.statefile.unreadable,
            )
        self.state_write_failures = 0  # state file writes that failed (disk full, read-only)
        self._state_write_error: str | None = None
        self.observed: _Observed | None = None
        # UDP virtual servers whose real servers changed, to flush: -> the addresses removed.
        self._udp_changed: dict[ServiceKey, set[str]] = {}
        # Those whose flush failed: flushed again when their Service's retry is due.
        self._udp_failed: dict[ServiceKey, set[str]] = {}
        self.failures = Failures(retry_clock)
        self.sysctls_tried = False  # the required sysctls are set once, at the first sync
        self.sysctl_failures: dict[str, str] = {}  # sysctl -> why it could not be set
        # A kernel read or set creation that fails, by what: reported when it starts failing
        # (or fails otherwise), not at every sync; gone once it works again.
        self.kernel_problems: dict[str, str] = {}
        # (set name, entry) -> the Services that want it, while a sync blames failed members
        self._owners: dict[tuple[str, str], list[str]] | None = None

    # -- input -------------------------------------------------------------------------------

    def update_service(
        self, service: str, svc: Mapping[str, Any] | None, slices: Iterable[Mapping[str, Any]]
    ) -> str | None:
        """Re-plan one Service (None: deleted); returns what ``errors`` now says of it: why it
        cannot be programmed, or what of it was left out (None: nothing).

        A spec that cannot be programmed keeps the Service's last good spec (a bad edit must not
        take a working Service down), planned with the current EndpointSlices, so that its real
        servers keep following its pods; if even that fails, the last good plan stays.
        """
        slices = list(slices)
        plan = self._plan(svc, slices)
        error = plan.error
        if error:
            self.invalid[service] = error
            good = self.last_good.get(service)
            if good is None:
                return self._report(service)
            plan = self._plan(good, slices)
            if plan.error:
                return self._report(service)
        else:
            self.invalid.pop(service, None)
            if svc is None:
                self.last_good.pop(service, None)
            else:
                self.last_good[service] = svc
        self.pending.merge(self.desired.update(service, plan))
        self._identify(service)
        for other in sorted(self.desired.moved):
            # This update took a virtual server from it, or gave one back.
            self._identify(other)
            report = self._report(other)
            if report is not None and other in self.desired.lost:
                self.notices[other] = report
        return self._report(service)

    def _identify(self, service: str) -> None:
        """The names of ``service``'s virtual servers as applied (not those another Service
        owns), for status."""
        plan = self.desired.applied.get(service) or self.desired.plans.get(service)
        if plan is not None and plan.virtual_servers:
            self.state.identities[service] = plan.identity
        else:
            self.state.identities.pop(service, None)

    def _report(self, service: str) -> str | None:
        """Set what ``errors`` says of ``service``: why its spec cannot be programmed, what of
        it was left out, and which of its virtual servers another Service has; returns that
        (None: nothing to report)."""
        error = self.invalid.get(service)
        parts = [error] if error else []
        plan = self.desired.plans.get(service)
        if plan is not None:
            parts += plan.warnings
        parts += self.desired.conflicts(service)
        report = "; ".join(parts) or None
        if report is None:
            self.errors.pop(service, None)
        else:
            self.errors[service] = report
        return report

    def _plan(self, svc: Mapping[str, Any] | None, slices: list[Mapping[str, Any]]) -> ServicePlan:
        """plan_service; whatever it raises is this Service's error, no one else's."""
        try:
            return plan_service(svc, slices, self.node, self.plan_config)
        except Exception as exc:
            return replace(EMPTY, error=f"cannot plan: {type(exc).__name__}: {exc}")

    @property
    def failed(self) -> dict[str, Failure]:
        """Services with an operation that failed, until their retry succeeds."""
        return self.failures.by_service

    def next_retry(self) -> float | None:
        """time.monotonic() of the earliest retry of a failed Service, if any."""
        return self.failures.next_retry()

    # -- ownership ---------------------------------------------------------------------------

    def _excluded(self, address: str) -> bool:
        ip = ipaddress.ip_address(address)
        return any(ip in net for net in self.exclude)

    def owns_address(self, address: str) -> bool:
        """Addresses on kube-ipvs0 are ours (the device is ours), except excludeCIDRs."""
        return not self._excluded(address)

    def owns_service(self, key: ServiceKey) -> bool:
        if self._excluded(key.address):
            return False
        if key in self.state.virtual_servers:
            return True
        return self.observed is not None and key.address in self.observed.bound

    # -- converge ----------------------------------------------------------------------------

    def sync(self) -> SyncResult:
        """Apply what changed since the last sync, and retry the failed Services whose retry
        is due (a full reconcile the first time)."""
        if self.observed is None or self.observed.unread:
            return self.reconcile()
        start, writes = time.monotonic(), self.backends.writes()
        changes, self.pending = self.pending, Changes()
        result = SyncResult(full=False)
        retry = self.failures.begin()
        if retry:
            try:
                self._reread(retry)
            except Exception as exc:
                # The failed keys' cache is unknown: the next sync reads everything back.
                result.errors.append(f"re-reading the kernel for a retry: {exc}")
                self.observed = None
                self.pending.merge(changes)
                result.failed = self.failures.end(clear=False)
                return result
            changes.merge(retry)
            self._retry_udp(retry.services)
        self._converge(changes, result)
        result.writes = self.backends.writes() - writes
        result.seconds = time.monotonic() - start
        return result

    def reconcile(self) -> SyncResult:
        """Read the kernel back and converge everything; zero writes when nothing drifted."""
        start, writes = time.monotonic(), self.backends.writes()
        result = SyncResult(full=True)
        self.pending = Changes()
        # The old cache goes before the kernel is read again: at 10,000 Services both at once
        # were ~8 MiB on top of the state, the daemon's peak.
        self.observed = None
        self._ensure_sysctls(result)
        try:
            self.observed = self._read_kernel(result)
        except Exception as exc:
            result.errors.append(f"reading the kernel: {exc}")
            result.complete = False
            return result
        self._retry_udp(self.failures.begin(everything=True).services)
        self._converge(differing(self.desired, self.observed), result)
        result.writes = self.backends.writes() - writes
        result.seconds = time.monotonic() - start
        return result

    def _ensure_sysctls(self, result: SyncResult) -> None:
        """The sysctls IPVS needs, set once at start as upstream's NewProxier does, one at a
        time: one that cannot be written is reported once and programming goes on."""
        if self.sysctls_tried:
            return
        self.sysctls_tried = True
        for name, value in required(self.strict_arp).items():
            try:
                result.sysctls_set += self.backends.sysctls.ensure({name: value})
            except Exception as exc:
                self.sysctl_failures[name] = str(exc)
                result.errors.append(f"cannot set sysctl {name}={value}: {exc}")

    def _reread(self, keys: Changes) -> None:
        """Read back what the kernel holds for ``keys`` only (a retry after a failure, whose
        outcome may be unknown), into the cache."""
        obs = self.observed
        assert obs is not None
        if keys.services:
            kernel = self.backends.ipvs.services()
            for key in keys.services:
                if key in kernel:
                    obs.services[key] = kernel[key]
                    obs.dests[key] = self.backends.ipvs.dests(key)
                else:
                    obs.services.pop(key, None)
                    obs.dests.pop(key, None)
        if keys.addresses:
            bound = self.backends.addresses.bound()
            for address in keys.addresses:
                (obs.bound.add if address in bound else obs.bound.discard)(address)
        if any(keys.members.values()):
            sets = self.backends.ipsets.read()
            for name, entries in keys.members.items():
                have = obs.members.setdefault(name, set())
                for entry in entries:
                    (have.add if entry in sets.get(name, ()) else have.discard)(entry)

    def _read_kernel(self, result: SyncResult) -> _Observed:
        """What the kernel holds, held as the desired objects where it is as desired. A part
        whose read fails is reported and left out (``unread``); the others are read."""
        unread: set[str] = set()

        def read(part: str, what: str, fn: Callable[[], _T], default: _T) -> _T:
            if part in unread:
                return default
            try:
                value = fn()
            except Exception as exc:
                unread.add(part)
                self._problem(part, f"reading {what}: {type(exc).__name__}: {exc}", result)
                return default
            self._problem(part, None, result)
            return value

        want_vs, want_rs = self.desired.virtual_servers, self.desired.real_servers
        no_services: dict[ServiceKey, VirtualServer] = {}
        services = read(
            "ipvs",
            "IPVS",
            lambda: adopt_services(want_vs, self.backends.ipvs.each_service()),
            no_services,
        )
        no_addresses: set[str] = set()
        bound = read(
            "addresses",
            "kube-ipvs0",
            lambda: adopt_members(self.desired.bind_refs.keys(), self.backends.addresses.bound()),
            no_addresses,
        )
        # Read before anything is written: the NodePort sets as the node's previous proxy
        # left them tell its NodePort virtual servers (``_own``).
        members: dict[str, set[str]] = read(
            "ipsets",
            "ipsets",
            lambda: adopt_member_parts(self.desired.member_keys, self.backends.ipsets.each_part()),
            {},
        )
        no_local: frozenset[str] = frozenset()
        self._own(
            services,
            bound,
            members,
            lambda what: read("addresses", what, self._local_addresses, no_local),
        )
        watched = sorted(
            k
            for k in services
            if k in want_vs or k in self.state.virtual_servers or k.address in bound
        )
        dests: dict[ServiceKey, Mapping[DestKey, Seen]] = read(
            "ipvs",
            "IPVS",
            lambda: {
                k: adopt_dests(want_rs.get(k, {}), self.backends.ipvs.dests(k)) for k in watched
            },
            {},
        )
        if "ipsets" not in unread:
            self._ensure_sets(members, result)
        rules_text = read("iptables", "iptables", lambda: self._same_rules(), None)
        return _Observed(
            services, dests, bound, members, rules_text, frozenset(unread) - {"iptables"}
        )

    def _ensure_sets(self, members: dict[str, set[str]], result: SyncResult) -> None:
        """Create our sets that are missing, one at a time: one the kernel cannot create (a
        set type it lacks) is reported and stays out of ``members``; its members then fail
        the Services that want them."""
        for name in sorted(ipset_specs.UPSTREAM_NAMES - members.keys()):
            try:
                self.backends.ipsets.ensure(members.keys(), [name])
            except Exception as exc:
                self._problem(name, f"creating ipset {name}: {exc}", result)
                continue
            self._problem(name, None, result)
            members[name] = set()

    def _problem(self, what: str, message: str | None, result: SyncResult) -> None:
        """``what`` fails (``message``) or works (None); a new failure is reported once."""
        if message is None:
            self.kernel_problems.pop(what, None)
        elif self.kernel_problems.get(what) != message:
            self.kernel_problems[what] = message
            result.errors.append(message)

    def _own(
        self,
        services: Collection[ServiceKey],
        bound: Collection[str],
        members: Mapping[str, Collection[str]],
        read_local: Callable[[str], Collection[str]],
    ) -> None:
        """Ours, of the kernel's virtual ``services``: those the state file names (keys
        recorded before a write that never happened go), those the Services want (their
        real servers are programmed as ours anyway; a lost or unreadable state file, or a
        node taken over from kube-proxy, must not leave them behind once unwanted), and those
        on a node address whose port the kernel's NodePort set of upstream's name records
        (``ipsets.recorded_node_ports``: kube-proxy's NodePorts on a node taken over, also
        of Services deleted meanwhile). Those on kube-ipvs0 are ours by the device."""
        ours, want = self.state.virtual_servers, self.desired.virtual_servers
        ours.intersection_update(services)
        ours.update(k for k in want if k in services and not self._excluded(k.address))
        others = [
            k
            for k in services
            if k not in ours and k.address not in bound and not self._excluded(k.address)
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

    def _local_addresses(self) -> frozenset[str]:
        """The node's addresses but kube-ipvs0's and loopback (upstream's nodeAddressSet)."""
        return local_addresses(
            self.backends.addresses.indexed(), self.backends.addresses.device_index()
        )

    def _same_rules(self) -> str | None:
        """The rendered rules if our chains are as we last wrote them (same rendering, same
        kernel copy, jumps in place), else None: they are written at this sync."""
        ipt = self.backends.iptables.read()
        text = self._rules_text()
        same_rules = (
            not ipt.missing_jumps
            and hashlib.sha256(text.encode()).hexdigest() == self.state.rules_digest
            and ipt.fingerprint == self.state.iptables_fingerprint
        )
        return text if same_rules else None

    def _rules_text(self) -> str:
        return rules.render(
            self.rules_config, self.desired.nonempty_sets(), self.desired.out_filters()
        )

    def _converge(self, changes: Changes, result: SyncResult) -> None:
        """Each step on its own: what one step, or one Service's operations in it, raise is
        reported and the others go on. Operations fail their Service (``self.failures``)."""
        assert self.observed is not None
        self._owners = None
        # ``changes`` is this sync's own: each part goes once used (at a full sync's peak, the
        # first, every key and member of 10,000 Services was ~4 MiB).
        steps: list[tuple[str, Callable[[], None]]] = [
            ("addresses", lambda: self._bind(changes.addresses)),
            ("ipvs", lambda: self._services(changes.services)),
            ("", changes.services.clear),
            ("ipsets", lambda: self._members(changes.members)),
            ("", changes.members.clear),
            ("addresses", lambda: self._unbind(changes.addresses)),
            ("ipvs", lambda: self._drain()),
            ("", lambda: self._flush_udp()),
        ]
        unread = self.observed.unread
        for part, step in steps:
            if part in unread:
                continue
            try:
                step()
            except ApplyError as exc:  # each rejected operation failed its Service already
                result.errors.append(str(exc))
            except Exception as exc:  # not named by Service: the next sync reads everything
                result.errors.append(f"{type(exc).__name__}: {exc}")
                self.observed = None
        if self.observed is not None:
            try:
                self._rules(result)
            except Exception as exc:
                result.errors.append(f"iptables: {exc}")
                result.complete = False
        try:
            self._save_state()
        except Exception as exc:
            result.errors.append(f"saving the state file: {exc}")
        # A Service retried while a part of the kernel could not be read may not have been
        # tried at all: it stays failed until a sync that reads everything.
        self._owners = None
        result.failed = self.failures.end(
            clear=self.observed is not None and not self.observed.unread
        )

    # -- steps -------------------------------------------------------------------------------

    def _fail(self, owners: Iterable[str], reason: str, keys: Changes) -> None:
        for owner in owners:
            self.failures.fail(owner, reason, keys)

    def _owners_of_address(self, address: str) -> list[str]:
        """The Services that bind ``address`` ("" for none: a deleted Service's leftover)."""
        return self._owners_of_member(ipset_specs.IPVS_IPS, address)

    def _owners_of_member(self, name: str, entry: str) -> list[str]:
        """The Services that want ``entry`` in set ``name`` ("" for none)."""
        if self._owners is None:  # indexed once a sync, when first needed: failures are rare
            self._owners = {}
            for service, plan in self.desired.plans.items():
                for address in plan.bind:
                    self._owners.setdefault((ipset_specs.IPVS_IPS, address), []).append(service)
                for set_name, entries in plan.members.items():
                    for member in entries:
                        self._owners.setdefault((set_name, member), []).append(service)
        return self._owners.get((name, entry)) or [""]

    def _fail_address(self, op: AddressOp, why: object) -> None:
        keys = Changes(addresses={op.address}, members={ipset_specs.IPVS_IPS: {op.address}})
        self._fail(self._owners_of_address(op.address), f"{op}: {why}", keys)

    def _fail_member(self, op: MemberOp, why: object) -> None:
        keys = Changes(members={op.set_name: {op.entry}})
        self._fail(self._owners_of_member(op.set_name, op.entry), f"{op}: {why}", keys)

    def _fail_service(self, key: ServiceKey, why: str) -> None:
        owner = self.desired.owner.get(key, "")
        self._fail([owner], why, Changes(services={key}))

    def _addresses(self, ops: list[AddressOp], record: Callable[[list[AddressOp]], None]) -> None:
        def apply(chunk: list[AddressOp]) -> int:
            try:
                _apply(self.backends.addresses.apply, chunk, record)
            except ApplyError as exc:
                for i in exc.failed:
                    self._fail_address(chunk[i], _why(exc, chunk, i))
                raise
            return len(chunk)

        _each([ops] if ops else [], _isolating(apply, self._fail_address))

    def _bind(self, addresses: set[str]) -> None:
        assert self.observed is not None
        ops = address_ops(self.desired, addresses, self.observed.bound, self.owns_address)
        ops = [op for op in ops if op.kind is OpKind.ADD]
        bound = self.observed.bound
        self._addresses(ops, lambda done: bound.update(op.address for op in done))

    def _unbind(self, addresses: set[str]) -> None:
        assert self.observed is not None
        ops = address_ops(self.desired, addresses, self.observed.bound, self.owns_address)
        ops = [op for op in ops if op.kind is OpKind.DELETE]
        bound = self.observed.bound
        self._addresses(ops, lambda done: bound.difference_update(o.address for o in done))

    def _services(self, keys: set[ServiceKey]) -> None:
        obs = self.observed
        assert obs is not None
        ordered = sorted(keys, key=SERVICE_ORDER)

        def apply(chunk: list[ServiceKey]) -> int:
            for key in chunk:
                if key not in self.desired.virtual_servers:
                    continue
                want = self.desired.real_servers[key]
                have = obs.dests.get(key, {})
                if any(d not in want for d in have):
                    # Draining decisions need the kernel's current connection counts.
                    obs.dests[key] = self.backends.ipvs.dests(key)
            ops = service_ops(
                self.desired, chunk, obs.services, obs.dests, self.owns_service, self._expired
            )
            created = self._intend(ops)
            try:
                _apply(self.backends.ipvs.apply, ops, self._record)
            except ApplyError as exc:
                self._blame(ops, exc)
                # Not created: maybe someone else's since (EEXIST), never ours.
                self.state.virtual_servers.difference_update(
                    k for i, k in created.items() if i in exc.failed
                )
                raise
            return len(ops)

        def fail(key: ServiceKey, exc: Exception) -> None:
            self._fail_service(key, f"{key}: {type(exc).__name__}: {exc}")

        _each(_chunked(ordered, CHUNK_VIRTUAL_SERVERS), _isolating(apply, fail))

    def _intend(self, ops: list[ServiceOp | DestOp]) -> dict[int, ServiceKey]:
        """Record the virtual servers ``ops`` create as ours in the state file before the
        kernel has them (returned by their index in ``ops``): killed between the write and
        the save, a later run must still know them (a NodePort's address is a node's, not on
        kube-ipvs0). One never created is forgotten at the next full sync (``_own``)."""
        ours = self.state.virtual_servers
        created = {
            i: op.server.key
            for i, op in enumerate(ops)
            if type(op) is ServiceOp and op.kind is OpKind.ADD and op.server.key not in ours
        }
        if created:
            ours.update(created.values())
            self._save_state()
        return created

    def _blame(self, ops: list[ServiceOp | DestOp], exc: ApplyError) -> None:
        """Fail the Services whose virtual or real servers the kernel refused."""
        for i in sorted(exc.failed):
            op = ops[i]
            key = op.server.key if isinstance(op, ServiceOp) else op.service
            self._fail_service(key, _why(exc, ops, i))

    def _record(self, ops: list[ServiceOp | DestOp]) -> None:
        """Fold applied operations into the cache and the state file's bookkeeping."""
        obs = self.observed
        assert obs is not None
        now = self.clock()
        draining = self.state.draining_since
        # Real server operations come grouped by virtual server: look its maps up once a group.
        service: ServiceKey | None = None
        dests: dict[DestKey, Seen] = {}
        want: Mapping[DestKey, RealServerLike] = {}
        touched: list[ServiceKey] = []
        gone: set[str] | None = None  # a UDP virtual server's real servers removed
        delete = OpKind.DELETE
        for op in ops:
            if isinstance(op, ServiceOp):
                key = op.server.key
                if op.kind is delete:
                    obs.services.pop(key, None)
                    obs.dests.pop(key, None)
                    self.state.virtual_servers.discard(key)
                else:
                    obs.services[key] = op.server
                    obs.dests.setdefault(key, {})
                    self.state.virtual_servers.add(key)
                service = None  # its real servers' map may have gone
                continue
            if op.service is not service:
                service = op.service
                dests = _own_copy(obs.dests, service)
                want = self.desired.real_servers.get(service, {})
                touched.append(service)
                gone = None
                if service.protocol is Protocol.UDP:  # its stale flows go at the sync's end
                    gone = self._udp_changed.setdefault(service, set())
            server = op.server
            dest = server if type(server) is DestKey else server.key
            if op.kind is delete:
                dests.pop(dest, None)
                draining.pop((service, dest), None)
                if gone is not None:
                    gone.add(dest.address)
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
        _share_desired(obs.dests, self.desired.real_servers, touched)

    def _flush_udp(self) -> None:
        """Upstream's CleanStaleEntries for the UDP virtual servers whose real servers this
        sync changed (``backends.conntrack.stale``); a failure fails that Service only."""
        changed, self._udp_changed = self._udp_changed, {}
        for service, gone in sorted(changed.items()):
            live = {d.address for d in self.desired.real_servers.get(service, {})}
            try:
                self.backends.conntrack.flush_stale(service, live, gone)
            except Exception as exc:
                why = f"conntrack cleanup of {service}: {type(exc).__name__}: {exc}"
                self._udp_failed.setdefault(service, set()).update(gone)
                self._fail_service(service, why)

    def _retry_udp(self, keys: Collection[ServiceKey]) -> None:
        """The failed flushes of the virtual servers ``keys`` (being retried) are done again
        at this sync's end: a retry that finds the virtual server as desired writes nothing,
        and the stale entries would stay."""
        for key in keys:
            gone = self._udp_failed.pop(key, None)
            if gone is not None:
                self._udp_changed.setdefault(key, set()).update(gone)

    def _expired(self, key: ServiceKey, have: Mapping[DestKey, Seen]) -> set[DestKey]:
        now = self.clock()
        if not self.state.draining_since:  # nothing drains: each one's grace starts now
            return set(have) if now - now >= self.grace_seconds else set()
        return {
            d
            for d in have
            if now - self.state.draining_since.get((key, d), now) >= self.grace_seconds
        }

    def _drain(self) -> None:
        """Real servers at weight 0: delete them once idle or past their grace period."""
        obs = self.observed
        assert obs is not None
        services = sorted({s for s, _ in self.state.draining_since})

        def apply(chunk: list[ServiceKey]) -> int:
            ops: list[ServiceOp | DestOp] = []
            for key in chunk:
                if key not in obs.services:
                    for dkey in [d for d in self.state.draining_since if d[0] == key]:
                        del self.state.draining_since[dkey]
                    continue
                obs.dests[key] = have = self.backends.ipvs.dests(key)
                want = self.desired.real_servers.get(key, {})
                expired = self._expired(key, have)
                deletes = diff_dests(key, want, have, expired)
                ops += [op for op in deletes if op.kind is OpKind.DELETE]
            try:
                _apply(self.backends.ipvs.apply, ops, self._record)
            except ApplyError as exc:
                self._blame(ops, exc)
                raise
            return len(ops)

        def fail(key: ServiceKey, exc: Exception) -> None:
            self._fail_service(key, f"draining {key}: {type(exc).__name__}: {exc}")

        _each([services] if services else [], _isolating(apply, fail))

    def _members(self, members: Mapping[str, set[str]]) -> None:
        obs = self.observed
        assert obs is not None

        def record(done: list[MemberOp]) -> None:
            for op in done:
                target = obs.members.setdefault(op.set_name, set())
                (target.add if op.kind is OpKind.ADD else target.discard)(op.entry)

        def apply(ops: list[MemberOp]) -> int:
            name = ops[0].set_name
            if name not in obs.members:
                try:
                    self.backends.ipsets.ensure(obs.members.keys(), [name])
                except Exception as exc:
                    for op in ops:
                        self._fail_member(op, f"ipset {name} cannot be created: {exc}")
                    return 0
                obs.members[name] = set()
            try:
                _apply(self.backends.ipsets.apply, ops, record)
            except ApplyError as exc:
                for i in exc.failed:
                    self._fail_member(ops[i], _why(exc, ops, i))
                raise
            return len(ops)

        chunks = (
            member_ops(self.desired, name, part, obs.members.get(name, set()))
            for name in sorted(members)
            for part in _chunked(sorted(members[name]), CHUNK_MEMBERS)
        )
        _each((c for c in chunks if c), _isolating(apply, self._fail_member))

    def _rules(self, result: SyncResult) -> None:
        obs = self.observed
        assert obs is not None
        text = self._rules_text()
        if text == obs.rules_text:
            return
        ipt = self.backends.iptables
        try:
            missing = ipt.read().missing_jumps
        except Exception as exc:  # our chains are written all the same
            self._problem("iptables", f"reading iptables: {type(exc).__name__}: {exc}", result)
            ipt.apply(text, ipt.missing_jumps_checked())
            obs.rules_text = text
            self.state.iptables_fingerprint = ""  # the next full sync checks them again
            return
        ipt.apply(text, missing)
        obs.rules_text = text
        self.state.rules_digest = hashlib.sha256(text.encode()).hexdigest()
        self.state.iptables_fingerprint = ipt.read().fingerprint

    def cleanup(self) -> SyncResult:
        """Remove everything ipvsproxy created on this node, and nothing else."""
        start, writes = time.monotonic(), self.backends.writes()
        result = SyncResult(full=True)
        self.observed = None
        bound = self.backends.addresses.bound()
        self.observed = _Observed({}, {}, bound, {}, None)
        ops: list[ServiceOp | DestOp] = [
            ServiceOp(OpKind.DELETE, vs)
            for key, vs in sorted(self.backends.ipvs.services().items())
            if self.owns_service(key)
        ]
        steps: list[Callable[[], object]] = [
            lambda: self.backends.ipvs.apply(ops),
            self.backends.iptables.remove,
            lambda: self.backends.ipsets.destroy(
                ipset_specs.NAMES & set(self.backends.ipsets.read())
            ),
            lambda: self._remove_addresses(bound),
        ]
        for step in steps:
            try:
                step()
            except Exception as exc:
                result.errors.append(str(exc))
        self.observed = None
        self.state = State()
        self._save_state()
        result.writes = self.backends.writes() - writes
        result.seconds = time.monotonic() - start
        return result

    def snapshot(self) -> Snapshot:
        operations: dict[tuple[str, str], int] = {}
        for backend in self.backends.each():
            for outcome, counts in (
                ("ok", backend.counters.ok),
                ("error", backend.counters.failed),
            ):
                for kind, n in counts.items():
                    operations[kind, outcome] = operations.get((kind, outcome), 0) + n
        return Snapshot(
            operations=operations,
            restore_failures=self.backends.iptables.restore_failures,
            state_write_failures=self.state_write_failures,
            draining=len(self.state.draining_since),
            no_local_endpoints=sum(p.no_local_endpoints for p in self.desired.plans.values()),
            failed_services=len(self.failed),
            kernel_problems=len(self.kernel_problems) + len(self.sysctl_failures),
        )

    def sysctls(self) -> dict[str, str]:
        """The kernel settings IPVS forwarding needs, as they are now (for status and logs)."""
        return self.backends.sysctls.read(required(self.strict_arp))

    def _remove_addresses(self, bound: set[str]) -> None:
        """Unbind our addresses; the device goes only if nothing excluded is left on it."""
        ours = [AddressOp(OpKind.DELETE, a) for a in sorted(bound) if self.owns_address(a)]
        self.backends.addresses.apply(ours)
        if len(ours) == len(bound):
            self.backends.addresses.remove_device()

    def _save_state(self) -> None:
        """Write the state file; a failed write (disk full, read-only) is logged and counted,
        and programming goes on: the next save writes everything again."""
        try:
            self.statefile.save(self.state)
        except OSError as exc:
            self.state_write_failures += 1
            if str(exc) != self._state_write_error:
                log.warning("cannot write the state file %s: %s", self.statefile.path, exc)
            self._state_write_error = str(exc)
            return
        if self._state_write_error is not None:
            log.info("the state file %s is written again", self.statefile.path)
            self._state_write_error = None


# -- the diff step, pure: what a sync compares once the kernel's state is known ------------------


def differing(desired: DesiredState, obs: _Observed) -> Changes:
    """The keys whose kernel state a full sync must look at: every one not held as the
    desired object itself. Reading the kernel back compared each of its objects with the
    desired one and kept the desired object where they are the same (``adopt_*``), so a key
    held as that object needs nothing. Naming every key instead held a copy of each (~8 MiB at
    10,000 Services) for a sync that, without drift, writes nothing."""
    want_vs, want_rs = desired.virtual_servers, desired.real_servers
    services = {
        k
        for k, vs in want_vs.items()
        if obs.services.get(k) is not vs or obs.dests.get(k) is not want_rs[k]
    }
    services.update(k for k in obs.services if k not in want_vs)
    return Changes(
        services=services,
        addresses=_either(desired.bind_refs.keys(), obs.bound),
        members={
            n: _either(desired.member_keys(n), obs.members.get(n, set())) for n in ipset_specs.NAMES
        },
        rules=True,
    )


def _either(a: Collection[str], b: Collection[str]) -> set[str]:
    """The entries in just one of ``a`` and ``b``, in a set sized for them (``a ^ b`` is sized
    for all of ``a``: 5 MiB of empty tables at 10,000 Services)."""
    return set(filterfalse(a.__contains__, b)) | set(filterfalse(b.__contains__, a))


def address_ops(
    desired: DesiredState,
    addresses: set[str],
    bound: set[str],
    owned: Callable[[str], bool],
) -> list[AddressOp]:
    """Binds and unbinds for the changed ``addresses``, against those ``bound`` now."""
    want = {a for a in addresses if a in desired.bind_refs}
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
    desired mapping instead of its own copy: after a cold sync of 10,000 Services the copies
    were ~9 MiB (a dict per virtual server), all equal to mappings already held."""
    for service in services:
        want, have = desired.get(service), dests.get(service)
        if want is not None and have is not None and have is not want and have == want:
            dests[service] = want


_T = TypeVar("_T")
_C = TypeVar("_C")

# A full sync converges this many virtual servers (or ipset members) at a time: their
# operations, encoded requests and outcomes are all that is held at once. Planning every
# operation of 10,000 Services first held ~170 MB of them at the cold sync's peak.
CHUNK_VIRTUAL_SERVERS = 512
CHUNK_MEMBERS = 4096


def _chunked(items: Sequence[_T], size: int) -> Iterator[list[_T]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _each(chunks: Iterable[_C], apply: Callable[[_C], int]) -> None:
    """``apply`` each chunk in order (it returns how many operations it applied); a chunk the
    kernel partly rejected does not stop the others: the rejections are raised together at
    the end."""
    rejected: list[Rejected] = []
    applied = 0
    for chunk in chunks:
        try:
            applied += apply(chunk)
        except ApplyError as exc:
            rejected += exc.rejected
            applied += exc.applied
    if rejected:
        raise ApplyError(rejected, applied)


def _isolating(
    apply: Callable[[list[_T]], int], blame: Callable[[_T, Exception], None]
) -> Callable[[list[_T]], int]:
    """``apply`` for a chunk; if it raises anything but ApplyError (a codec's struct.error,
    pyroute2's NetlinkError, a bug), each item of the chunk is applied on its own, and those
    that raise again are blamed: only their owners fail, the others are applied."""

    def run(chunk: list[_T]) -> int:
        try:
            return apply(chunk)
        except ApplyError:
            raise
        except Exception as exc:
            if len(chunk) == 1:
                blame(chunk[0], exc)
                return 0
        rejected: list[Rejected] = []
        applied = 0
        for item in chunk:
            try:
                applied += apply([item])
            except ApplyError as exc:
                rejected += exc.rejected
                applied += exc.applied
            except Exception as exc:
                blame(item, exc)
        if rejected:
            raise ApplyError(rejected, applied)
        return applied

    return run


def _why(exc: ApplyError, ops: Sequence[object], i: int) -> str:
    """The kernel's refusal of ``ops[i]``, by its position among the refused ones."""
    failed = sorted(exc.failed)
    if i in failed and failed.index(i) < len(exc.rejected):
        return str(exc.rejected[failed.index(i)])
    return f"{ops[i]}: refused"


def _apply(
    apply: Callable[[list[_T]], object], ops: list[_T], record: Callable[[list[_T]], None]
) -> None:
    """Apply ``ops`` and record those the kernel accepted, also when some were rejected."""
    try:
        apply(ops)
    except ApplyError as exc:
        record([op for i, op in enumerate(ops) if i not in exc.failed])
        raise
    record(ops)
