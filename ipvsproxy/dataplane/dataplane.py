"""The dataplane: plans Services, diffs them against what the kernel holds, applies the
difference through the backends.

Two ways to converge. ``sync()`` applies only what changed since the last sync, against a cache
of the kernel that every successful write keeps current: a change costs work in proportion to
the change. ``reconcile()`` reads the kernel back and compares everything: it repairs drift,
adopts what a previous run programmed, and writes nothing when nothing differs.

``Dataplane`` holds the orchestration; its parts are modules of their own: ``observed`` (the
kernel's state as read, adoption, the cache), ``differ`` (the pure diff step), ``steps`` (the
converge steps that write), ``batching`` (chunks, isolating what fails), ``blame`` (which
Service a failure fails), ``drain`` (graceful termination, stale UDP flows), ``cleanup``
(``ipvsproxy cleanup``), ``statefile`` and ``retries``.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ipvsproxy.core import ipset_specs, ruleset
from ipvsproxy.core.desired import Changes, DesiredState
from ipvsproxy.core.diff import DestOp, ServiceOp
from ipvsproxy.core.plan import EMPTY, NodeFacts, PlanConfig, ServicePlan, plan_service
from ipvsproxy.core.service_ports import cut
from ipvsproxy.core.virtual_servers import DestKey, Seen, ServiceKey
from ipvsproxy.dataplane.blame import Blame
from ipvsproxy.dataplane.cleanup import remove_ours
from ipvsproxy.dataplane.differ import differing
from ipvsproxy.dataplane.drain import FlushRun, StaleUdpFlows, drain, expired
from ipvsproxy.dataplane.observed import (
    Observed,
    Problem,
    adopt_recorded,
    read_kernel,
    record_ipvs,
    reread,
)
from ipvsproxy.dataplane.retries import Failure, Failures
from ipvsproxy.dataplane.snapshot import DesiredView, Snapshot
from ipvsproxy.dataplane.statefile import State, StateFile
from ipvsproxy.dataplane.steps import (
    bind_addresses,
    converge_members,
    converge_virtual_servers,
    unbind_addresses,
    write_rules,
    write_rules_leaving_out,
)
from ipvsproxy.kernel.backends import Backends as Backends
from ipvsproxy.kernel.errors import ApplyError
from ipvsproxy.kernel.iptables import restore_failures_by_family
from ipvsproxy.kernel.sysctl import expected, not_as_expected, required

log = logging.getLogger("ipvsproxy")

DEFAULT_GRACE_SECONDS = 15 * 60
DEFAULT_PLAN_CONFIG = PlanConfig()
DEFAULT_RULES_CONFIG = ruleset.RulesConfig()


@dataclass
class SyncResult:
    full: bool
    writes: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    sysctls_set: list[str] = field(default_factory=list)  # kernel settings this sync changed
    failed: dict[str, str] = field(default_factory=dict)  # Services that failed, and why
    conntrack: list[FlushRun] = field(default_factory=list)  # each family's stale UDP flush
    # The sync ran to its end: upstream's proxier marks itself updated (healthy) then. Only
    # rules that could not be written even without any set's rules (the base every node
    # needs) stop that, as upstream's failed iptables-restore does.
    complete: bool = True


class Dataplane:
    """Programs this node's Services into the kernel through ``backends``: IPVS virtual and
    real servers, addresses on kube-ipvs0, ipset members and iptables rules.

    It owns the desired state (``desired``: every Service's plan, fed by ``update_service``),
    the changes not yet applied (``pending``), the observed cache (``observed``: what the
    kernel holds of ours; None until read, and whenever what it holds is unknown), the state
    file (``state``: which virtual servers are ours, which real servers drain since when, the
    rules as last written) and the failed Services with their retries (``failures``).

    Invariants:

    - ``sync()`` applies only the changes ``update_service`` marked, and the keys of failed
      Services whose retry is due (read back first: a failed write's outcome is unknown),
      against the cache; without a whole cache it is a ``reconcile()``.
    - ``reconcile()`` reads the kernel back and compares everything; without drift it writes
      nothing. A part of the kernel that cannot be read is left alone, and the next sync is a
      full one.
    - Never deletes foreign state. Ours are: addresses on kube-ipvs0 (the device is ours);
      virtual servers the state file names, those the Services want, those on kube-ipvs0 and
      NodePorts the previous proxy's ipsets record; our ipsets and chains. Nothing in
      excludeCIDRs is ours. ``cleanup()`` removes what is ours, and nothing else.
    - One failure fails only its Service: an operation the kernel refuses, or one that raises,
      fails the Service that wants its object, retried on its own backoff; the others are
      programmed. An error no Service can be blamed for drops the cache: the next sync reads
      the kernel back.
    - Rules are written as the kernel can hold them: the rules of a set that does not exist,
      or that the kernel refuses (``rules_refused``), are left out and fail the Services with
      members in that set; they are tried again with those Services' retries.
    - A real server no Service wants drains at weight 0 until idle or past ``grace_seconds``.
    - Every successful write is recorded in the cache; the state file names a virtual server
      as ours before the kernel has it, and forgets it once deleted.
    """

    def __init__(
        self,
        node: NodeFacts,
        backends: Backends,
        state_path: Path,
        plan_config: PlanConfig = DEFAULT_PLAN_CONFIG,
        rules_config: ruleset.RulesConfig = DEFAULT_RULES_CONFIG,
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
        # What of the state file cannot be read or written now (log, /healthz, status); None
        # once a save wrote it.
        self.state_problem: str | None = self.statefile.unreadable
        if self.statefile.unreadable:
            log.warning(
                "%s; falling back, for what it does not name, to what the kernel shows is "
                "ours: virtual servers on addresses bound to kube-ipvs0, those the Services "
                "want and NodePorts the NodePort ipsets record",
                self.statefile.unreadable,
            )
        self.state_write_failures = 0  # state file writes that failed (disk full, read-only)
        self._state_write_error: str | None = None
        self.observed: Observed | None = None
        self.stale_udp = StaleUdpFlows()  # UDP virtual servers to flush at the sync's end
        self.failures = Failures(retry_clock)
        self.sysctls_tried = False  # the required sysctls are set once, at the first sync
        self.sysctl_failures: dict[str, str] = {}  # sysctl -> why it could not be set
        # A kernel read or set creation that fails, by what: reported when it starts failing
        # (or fails otherwise), not at every sync; gone once it works again.
        self.kernel_problems: dict[str, str] = {}
        # Sets whose rules the kernel refused (a match it lacks), and why: left out of the
        # rules, their Services failed, tried again with those Services' retries.
        self.rules_refused: dict[str, str] = {}

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
            return replace(EMPTY, error=f"cannot plan: {type(exc).__name__}: {cut(str(exc))}")

    @property
    def failed(self) -> dict[str, Failure]:
        """Services with an operation that failed, until their retry succeeds."""
        return self.failures.by_service

    def next_retry(self) -> float | None:
        """time.monotonic() of the earliest retry of a failed Service, if any; now when a
        conntrack cleanup its bounds stopped is to go on."""
        if self.stale_udp.unfinished:
            return self.failures.clock()
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
                reread(self.observed, retry, self.backends)
            except Exception as exc:
                # The failed keys' cache is unknown: the next sync reads everything back.
                result.errors.append(f"re-reading the kernel for a retry: {exc}")
                self.observed = None
                self.pending.merge(changes)
                result.failed = self.failures.end(clear=False)
                return result
            changes.merge(retry)
            self.stale_udp.retry(retry.services)
            self._retry_rules(retry)
        self._converge(changes, result)
        result.writes = self.backends.writes() - writes
        result.seconds = time.monotonic() - start
        return result

    def reconcile(self) -> SyncResult:
        """Read the kernel back and converge everything; zero writes when nothing drifted."""
        start, writes = time.monotonic(), self.backends.writes()
        result = SyncResult(full=True)
        self.pending = Changes()
        # The old cache goes before the kernel is read again: never two caches at once.
        self.observed = None
        self._ensure_sysctls(result)
        try:
            self.observed = read_kernel(
                self.backends,
                self.desired,
                self.state,
                excluded=self._excluded,
                render_rules=self._rules_text,
                problem=lambda what, message: self._problem(what, message, result),
                families=self.plan_config.families,
            )
        except Exception as exc:
            result.errors.append(f"reading the kernel: {exc}")
            result.complete = False
            return result
        retry = self.failures.begin(everything=True)
        self.stale_udp.retry(retry.services)
        self._retry_rules(retry)
        self._converge(differing(self.desired, self.observed), result)
        result.writes = self.backends.writes() - writes
        result.seconds = time.monotonic() - start
        return result

    def _ensure_sysctls(self, result: SyncResult) -> None:
        """The sysctls IPVS needs, set once at start as upstream's NewProxier does, one at a
        time: one that cannot be written is reported once and programming goes on. Those the
        served families need but ipvsproxy leaves alone (``expected``) are read, and reported
        once when they differ."""
        if self.sysctls_tried:
            return
        self.sysctls_tried = True
        for name, value in required(self.strict_arp).items():
            try:
                result.sysctls_set += self.backends.sysctls.ensure({name: value})
            except Exception as exc:
                self.sysctl_failures[name] = str(exc)
                result.errors.append(f"cannot set sysctl {name}={value}: {exc}")
        for name, wanted in expected(self.plan_config.families).items():
            try:
                value = self.backends.sysctls.read({name: wanted})[name]
            except Exception as exc:
                value = f"unreadable ({exc})"
            if value != wanted:
                self.sysctl_failures[name] = not_as_expected(name, value, wanted)
                result.errors.append(self.sysctl_failures[name])

    def _problem(self, what: str, message: str | None, result: SyncResult) -> None:
        """``what`` fails (``message``) or works (None); a new failure is reported once."""
        if message is None:
            self.kernel_problems.pop(what, None)
        elif self.kernel_problems.get(what) != message:
            self.kernel_problems[what] = message
            result.errors.append(message)

    def _retry_rules(self, retry: Changes) -> None:
        """The rules of the sets whose members a retry converges again are tried again, and
        the out filters if it converges one's virtual server again."""
        for name in retry.members:
            self.rules_refused.pop(name, None)
        if ruleset.OUT_FILTERS in self.rules_refused and any(
            ServiceKey(f.address, f.protocol, f.port) in retry.services
            for f in self.desired.out_filters()
        ):
            del self.rules_refused[ruleset.OUT_FILTERS]

    def _existing_sets(self) -> Collection[str] | None:
        """Our sets that exist in the kernel, as the cache has them (None: unknown)."""
        obs = self.observed
        if obs is None or "ipsets" in obs.unread:
            return None
        return obs.members.keys()

    def _rules_text(
        self, existing: Collection[str] | None = None, leave_out: frozenset[str] = frozenset()
    ) -> str:
        """The rules of the non-empty sets but those that do not exist (``existing``: those
        that do; None: unknown), those whose rules the kernel refused and ``leave_out``."""
        out = self.rules_refused.keys() | leave_out
        sets = self.desired.nonempty_sets() - out
        if existing is not None:
            sets = frozenset(name for name in sets if name in existing)
        filters = [] if ruleset.OUT_FILTERS in out else self.desired.out_filters()
        return ruleset.render_families(self.rules_config, sets, filters, self.plan_config.families)

    def _write_rules(self, blame: Blame, result: SyncResult, problem: Problem) -> None:
        """Write the rules the kernel can hold: the groups of rules it refuses are left out
        (``rules_refused``) and fail the Services with members in their sets. Rules that
        cannot be written even without them make the sync incomplete."""
        obs = self._cache()
        wanted = set(self.desired.nonempty_sets())
        if self.desired.out_filters():
            wanted.add(ruleset.OUT_FILTERS)
        self.rules_refused = {k: v for k, v in self.rules_refused.items() if k in wanted}
        existing = self._existing_sets()
        groups = ruleset.rule_groups(
            wanted - self.rules_refused.keys(),
            self.plan_config.families,
            out_filters=ruleset.OUT_FILTERS in wanted - self.rules_refused.keys(),
        )
        if existing is not None:
            groups = [g for g in groups if g in existing or g == ruleset.OUT_FILTERS]
        try:
            refused = write_rules_leaving_out(
                lambda out: self._rules_text(existing, out),
                groups,
                lambda text: write_rules(text, obs, self.state, self.backends, problem),
            )
        except Exception as exc:
            result.errors.append(f"iptables: {exc}")
            result.complete = False
            return
        self.rules_refused.update(refused)
        for name, why in sorted(self.rules_refused.items()):
            if name == ruleset.OUT_FILTERS:
                reason = f"the kernel refuses the {name} rules of its load-balancer IPs: {why}"
                blame.out_filters(reason, again=name in refused)
            else:
                reason = f"the kernel refuses the iptables rules of ipset {name}: {why}"
                blame.rules(name, reason, again=name in refused)

    def _converge(self, changes: Changes, result: SyncResult) -> None:
        """Each step on its own: what one step, or one Service's operations in it, raise is
        reported and the others go on. Operations fail their Service (``self.failures``)."""
        assert self.observed is not None
        desired, backends = self.desired, self.backends
        blame = Blame(desired, self.failures)

        def problem(what: str, message: str | None) -> None:
            self._problem(what, message, result)

        # ``changes`` is this sync's own: each part goes once used, so a full sync does not
        # hold every key and member while it writes.
        steps: list[tuple[str, Callable[[], None]]] = [
            (
                "addresses",
                lambda: bind_addresses(
                    changes.addresses, desired, self._cache(), backends, self.owns_address, blame
                ),
            ),
            (
                "ipvs",
                lambda: converge_virtual_servers(
                    changes.services,
                    desired,
                    self._cache(),
                    self.state,
                    backends,
                    owned=self.owns_service,
                    expired=self._expired,
                    record=self._record,
                    blame=blame,
                    save_state=self._save_state,
                ),
            ),
            ("", changes.services.clear),
            (
                "ipsets",
                lambda: converge_members(changes.members, desired, self._cache(), backends, blame),
            ),
            ("", changes.members.clear),
            (
                "addresses",
                lambda: unbind_addresses(
                    changes.addresses, desired, self._cache(), backends, self.owns_address, blame
                ),
            ),
            (
                "ipvs",
                lambda: drain(
                    self._cache(),
                    self.state,
                    desired,
                    backends,
                    expired=self._expired,
                    record=self._record,
                    blame=blame,
                ),
            ),
            ("", lambda: result.conntrack.extend(self.stale_udp.flush(backends, desired, blame))),
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
            self._write_rules(blame, result, problem)
        try:
            self._save_state()
        except Exception as exc:
            result.errors.append(f"saving the state file: {exc}")
        # A Service retried while a part of the kernel could not be read may not have been
        # tried at all: it stays failed until a sync that reads everything.
        result.failed = self.failures.end(
            clear=self.observed is not None and not self.observed.unread
        )

    def _cache(self) -> Observed:
        """The observed cache, for a step; a step after one that dropped it fails."""
        assert self.observed is not None
        return self.observed

    def _record(self, ops: list[ServiceOp | DestOp]) -> None:
        """Fold applied IPVS operations into the cache and the state file's bookkeeping."""
        record_ipvs(
            ops, self._cache(), self.state, self.desired, self.clock(), self.stale_udp.changed
        )

    def _expired(self, key: ServiceKey, have: Mapping[DestKey, Seen]) -> set[DestKey]:
        return expired(key, have, self.state.draining_since, self.clock(), self.grace_seconds)

    def cleanup(self) -> SyncResult:
        """Remove everything ipvsproxy created on this node, and nothing else."""
        start, writes = time.monotonic(), self.backends.writes()
        result = SyncResult(full=True)
        self.observed = None
        bound = self.backends.addresses.bound()
        try:
            adopt_recorded(self.state, self.desired, self.backends, bound, self._excluded)
        except Exception as exc:  # the rest is removed all the same
            result.errors.append(f"reading the NodePort sets: {exc}")
        # owns_service: the virtual servers on kube-ipvs0's addresses are ours.
        self.observed = Observed({}, {}, bound, {}, None)
        result.errors += remove_ours(self.backends, bound, self.owns_service, self.owns_address)
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
            restore_failures=restore_failures_by_family(self.backends.iptables),
            state_write_failures=self.state_write_failures,
            draining=len(self.state.draining_since),
            no_local_endpoints=Counter(
                k for p in self.desired.plans.values() for k in p.no_local_endpoints
            ),
            failed_services=len(self.failed),
            kernel_problems=len(self.kernel_problems) + len(self.sysctl_failures),
        )

    def sysctls(self) -> dict[str, str]:
        """The kernel settings IPVS forwarding needs, as they are now (for status and logs)."""
        names = {**required(self.strict_arp), **expected(self.plan_config.families)}
        return self.backends.sysctls.read(names)

    def _save_state(self) -> None:
        """Write the state file; a failed write (disk full, read-only) is logged and counted,
        and programming goes on: the next save writes everything again."""
        try:
            wrote = self.statefile.save(self.state)
        except OSError as exc:
            self.state_write_failures += 1
            self.state_problem = f"cannot write the state file {self.statefile.path}: {exc}"
            if str(exc) != self._state_write_error:
                log.warning(
                    "%s; programming goes on, but a restart meanwhile would know only what "
                    "the kernel shows is ours",
                    self.state_problem,
                )
            self._state_write_error = str(exc)
            return
        if wrote:
            self.state_problem = None
        if self._state_write_error is not None:
            log.info("the state file %s is written again", self.statefile.path)
            self._state_write_error = None

    def desired_sets(self) -> dict[str, Collection[str]]:
        """The sets a full sync keeps, each with the members it should hold (the desired
        state's own collections: read them under the daemon's sync lock). Every other set of
        ours should hold nothing; a full sync creates those named here that are missing."""
        names = ipset_specs.upstream_names(self.plan_config.families) | self.desired.nonempty_sets()
        return {name: self.desired.member_keys(name) for name in sorted(names)}

    def expected_chains(self) -> dict[ruleset.ChainKey, str | None] | None:
        """Each chain a restore would write now -> its digest as the kernel held it when its
        rules were last written (or found written); None for a chain whose rendered rules
        changed since, or whose kernel copy is unknown (a full sync writes it). None before
        the first full sync and after the cache was dropped: the next one reads them again."""
        obs = self.observed
        if obs is None:
            return None
        now = ruleset.rendered_chains(self._rules_text(self._existing_sets()))
        written = ruleset.rendered_chains(obs.rules_text or "")
        return {
            key: obs.chains.get(key) if written.get(key) == lines else None
            for key, lines in sorted(now.items())
        }

    def desired_view(self) -> DesiredView:
        """The desired IPVS state and the Services' names, for the daemon's /status."""
        return DesiredView(
            self.desired.virtual_servers,
            self.desired.real_servers,
            self.state.identities,
            self.desired.binds(),
        )
