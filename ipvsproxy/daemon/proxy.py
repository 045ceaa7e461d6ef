"""``ipvsproxy run``'s core: informers feed changed Services to the dataplane; a runner syncs
them.

Watch events only mark Services as changed. The runner applies the marked ones no more often
than minSyncPeriod, and every syncPeriod runs a full reconcile that reads the kernel back.
Nothing is written to the kernel before Services and EndpointSlices have both completed their
first list. SIGTERM leaves the dataplane in place: traffic keeps flowing while the pod restarts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ipvsproxy.config import ProxyConfig
from ipvsproxy.core.ruleset import ChainKey
from ipvsproxy.core.service_ports import cut
from ipvsproxy.core.virtual_servers import ServiceKey
from ipvsproxy.daemon.changes import (
    ChangeTracker,
    Marks,
    slice_family,
    slice_service,
    trigger_time,
)
from ipvsproxy.daemon.node import POD_CIDR_WAIT, NodeTracker
from ipvsproxy.daemon.runner import SyncRunner
from ipvsproxy.daemon.targets import health_check_targets
from ipvsproxy.daemon.telemetry import Telemetry
from ipvsproxy.dataplane.dataplane import Dataplane, SyncResult
from ipvsproxy.dataplane.snapshot import DesiredView
from ipvsproxy.kube.events import EventRecorder
from ipvsproxy.kube.informer import Informer, Kept
from ipvsproxy.process import gc_tuning
from ipvsproxy.servers.healthz import HealthState
from ipvsproxy.servers.metrics import FAMILY_LABELS, Metrics
from ipvsproxy.servers.service_health import HealthCheckServers
from ipvsproxy.servers.traffic_metrics import PortName, port_names
from ipvsproxy.status import view

log = logging.getLogger("ipvsproxy")


@dataclass(frozen=True)
class StatusCopy:
    """What /status and /status/all show, copied at the end of a sync under the sync lock (the
    desired state's values are replaced, never changed in place: copying the mappings copies
    the state); the answers are built from it with no lock held."""

    node: str
    desired: DesiredView
    last_sync: float | None
    invalid: Mapping[str, str]
    sets: Mapping[str, Collection[str]]
    chains: Mapping[ChainKey, str | None] | None


class Proxy:
    """The daemon: keeps the dataplane converged on the Services and EndpointSlices the
    informers see. It composes

    - ``changes`` (daemon.changes): the informers' objects and the Services marked as changed;
    - ``node`` (daemon.node): this node's Node object and addresses, kept current in the
      dataplane's node facts;
    - ``runner`` (daemon.runner): when to sync: the marks at most every minSyncPeriod, a full
      reconcile every syncPeriod, retries and backoff;
    - ``telemetry`` (daemon.telemetry): what each sync reports (metrics, log, Events);
    - ``health`` (/healthz, /livez, /readyz) and ``health_checks``, one server per eTP=Local
      Service's healthCheckNodePort (daemon.targets).

    Threads: the informers call the ``on_*`` handlers, which only mark; the runner thread
    (``run``) syncs; HTTP threads read ``status_document`` and ``health``. A sync holds
    ``sync_lock`` from the node refresh and the hand-over of the marked Services to the
    dataplane until its result is recorded and ``status`` copied: ``status_document`` reads
    that copy, never the lock, so it sees no half-applied sync and cannot delay one. Before
    the Services' and EndpointSlices' first lists are done (``synced``) nothing is synced and
    nothing counts as queued for /healthz."""

    def __init__(self, cfg: ProxyConfig, dataplane: Dataplane, metrics: Metrics) -> None:
        self.cfg = cfg
        self.dp = dataplane
        self.metrics = metrics
        self.health = HealthState(
            timeout=2 * cfg.sync_period,
            families=tuple(FAMILY_LABELS[f] for f in dataplane.plan_config.families),
        )
        self.stop = threading.Event()
        self.informers: list[Informer] = []
        self.events: EventRecorder | None = None
        self.changes = ChangeTracker(on_mark=self._queued, started=time.time())
        self.node = NodeTracker(
            cfg, dataplane, self.health, self.changes, self.stop, metrics.helper_failed
        )
        self.telemetry = Telemetry(metrics, self._warn, families=dataplane.plan_config.families)
        self.runner = SyncRunner(
            self.changes,
            sync_period=cfg.sync_period,
            min_sync_period=cfg.min_sync_period,
            reconcile=lambda: self.reconcile(),
            apply_changes=lambda: self.apply_changes(),
            next_retry=lambda: self.dp.next_retry(),
            stop=self.stop,
            on_exception=self._after_exception,
        )
        self.health_checks = HealthCheckServers(
            proxy_healthy=lambda: self.health.status(node_check=False)[0] == 200,
            report=self._warn,
        )
        self.sync_lock = threading.Lock()
        self.last_sync: float | None = None  # wall time of the last sync that ran to its end
        # What /status shows: a copy taken under the sync lock when asked for after a sync
        # ended (``syncs`` counts them; ``copied``: the count it was taken at), never during
        # one. Nothing synced yet: nothing desired.
        self._status = StatusCopy(dataplane.node.name, DesiredView({}, {}, {}), None, {}, {}, None)
        self._syncs, self._copied = 0, 0

    # -- events ------------------------------------------------------------------------------

    def _warn(self, service: str, reason: str, message: str) -> None:
        if self.events is not None:
            self.events.warn(service, reason, message)

    def _queued(self) -> None:
        """A Service was marked (called under ``changes.cond``)."""
        if self.synced():  # upstream queues nothing before its initial lists are done
            self.health.queued()
            self.telemetry.queued()
        self.telemetry.changes_pending(*self.changes.pending_changes())

    def on_service(self, key: str, _old: Kept | None, new: Kept | None) -> None:
        """As upstream's dual-stack proxy, which hands every Service event to each family's
        tracker, each of which counts it."""
        self.changes.set_service(key, new)
        self.metrics.service_total.inc(len(self.dp.plan_config.families))
        self.changes.mark_service(key)

    def on_slice(self, key: str, old: Kept | None, new: Kept | None) -> None:
        """An EndpointSlice counts as a change of its family's tracker (upstream's: none for
        a family not served, nor for FQDN). A slice moved to another Service (its
        service-name label changed) is deleted from the first."""
        if old is not None and new is not None and slice_service(old) != slice_service(new):
            self.on_slice(key, old, None)
            old = None
        service = self.changes.set_slice(key, old, new)
        if service is None:
            return
        family = slice_family(new or old or {})
        if family not in self.dp.plan_config.families:
            self.changes.mark(service)
            return
        self.metrics.endpoint_total.inc()
        self.changes.mark_slice(service, family, trigger_time(new), deleted=new is None)

    def on_node(self, _key: str, _old: Kept | None, new: Kept | None) -> None:
        self.node.update(new)

    def wait_for_node(self, pod_cidr_timeout: float = POD_CIDR_WAIT) -> bool:
        """Until the Node informer's first list is done (see NodeTracker.wait)."""
        informer = next((i for i in self.informers if i.name == "node"), None)
        return self.node.wait(informer, pod_cidr_timeout)

    def request_stop(self) -> None:
        """Stop the runner and the loops that wait on ``stop``; the dataplane stays."""
        self.stop.set()
        with self.changes.cond:
            self.changes.cond.notify_all()

    # -- syncing -----------------------------------------------------------------------------

    def synced(self) -> bool:
        """Services and EndpointSlices have completed their first list (the Node need not)."""
        return all(i.synced.is_set() for i in self.informers if i.name != "node")

    def _replan(self) -> Marks:
        """Hand every Service marked since the last sync to the dataplane; return the marks."""
        self.node.refresh()
        marks = self.changes.take()
        self.telemetry.changes_pending(*self.changes.pending_changes())
        for service in sorted(marks):
            svc, slices = self.changes.inputs(service)
            try:
                error = self.dp.update_service(service, svc, slices)
            except Exception as exc:  # a bug: this Service's error, the others go on
                log.exception("cannot plan service %s", service)
                why = cut(str(exc))  # (it may quote a user's value)
                error = self.dp.errors[service] = f"cannot plan: {type(exc).__name__}: {why}"
            if error:
                log.warning("cannot program service %s: %s", service, error)
                self._warn(service, "InvalidService", error)
        # Services another one's update took a virtual server from.
        notices, self.dp.notices = self.dp.notices, {}
        for service, note in sorted(notices.items()):
            log.warning("cannot program service %s: %s", service, note)
            self._warn(service, "InvalidService", note)
        return marks

    def _converge(self, how: Callable[[], SyncResult], full: bool) -> SyncResult:
        with self.sync_lock:
            marks: Marks = {}

            def replan_and_sync() -> SyncResult:
                marks.update(self._replan())
                return how()

            result: SyncResult | None = None
            try:
                result = gc_tuning.paused_for(replan_and_sync, lambda r: r.full)
                done = self.telemetry.record(result, self.dp.snapshot(), marks)
                with self.health.lock:
                    self.health.state_file = self.dp.state_problem
            finally:
                # /livez: the sync loop is alive, whatever this sync's outcome (a sync may
                # turn out a full one: the first, or one after the cache was dropped).
                self.health.sync_ended(full or (result is not None and result.full))
            if done is not None:
                # As upstream: marks the proxier updated and clears what was queued.
                self.last_sync = done
                self.health.updated(done)
            self._syncs += 1
        self._health_checks()
        return result

    def apply_changes(self) -> SyncResult:
        return self._converge(self.dp.sync, full=False)

    def reconcile(self) -> SyncResult:
        return self._converge(self.dp.reconcile, full=True)

    def _after_exception(self, _exc: Exception) -> None:
        """A sync raised: counted, and the kernel is read back at the next sync."""
        self.metrics.sync_errors.inc()
        self.dp.observed = None

    def _health_checks(self) -> None:
        """One server per eTP=Local Service's healthCheckNodePort, with this node's count, on
        the node-port addresses."""
        with self.changes.cond:
            wanted = health_check_targets(
                self.changes.services, self.changes.slices, self.dp.node.name
            )
        # Upstream listens on nodePortAddresses' matches when it is set, else everywhere.
        addresses = self.dp.node.node_ips if self.cfg.node_port_addresses else None
        self.health_checks.sync(wanted, addresses)

    def run(self) -> None:
        """The sync runner: until stopped."""
        self.health.updated()  # as upstream's SyncLoop: healthy while the lists come in
        self.telemetry.queued()  # and "last change queued" synthesized as the lists come in
        if not self.runner.wait_until(self.synced):
            return
        with self.changes.cond:
            services = len(self.changes.services)
        log.info("initial lists done: %d services", services)
        self.runner.loop()

    # -- status ------------------------------------------------------------------------------

    @property
    def status(self) -> StatusCopy:
        """The status as of the last sync that ended: copied at the first request after it,
        under the sync lock; while a sync holds the lock, the copy taken before, at once (a
        request never waits for a sync, and a sync waits at most for one copy)."""
        if self._copied != self._syncs and self.sync_lock.acquire(blocking=False):
            try:
                self._status, self._copied = self._copy_status(), self._syncs
            finally:
                self.sync_lock.release()
        return self._status

    def _copy_status(self) -> StatusCopy:
        """The copy ``status_document`` reads (under the sync lock)."""
        desired = self.dp.desired_view()
        return StatusCopy(
            node=self.dp.node.name,
            desired=DesiredView(
                dict(desired.virtual_servers),
                dict(desired.real_servers),
                dict(desired.identities),
                frozenset(desired.addresses),
            ),
            last_sync=self.last_sync,
            invalid=self._invalid(),
            sets={name: frozenset(m) for name, m in self.dp.desired_sets().items()},
            chains=self.dp.expected_chains(),
        )

    def status_document(self, kernel: bool = False) -> dict[str, Any]:
        """The daemon's side of ``ipvsproxy status``: desired IPVS state and names as of the
        last sync; with ``kernel`` (``status --all``) also the sets and chains a full sync
        keeps. Built from ``status`` without the sync lock."""
        copy = self.status
        doc = view.daemon_document(
            node=copy.node,
            virtual_servers=copy.desired.virtual_servers,
            real_servers=copy.desired.real_servers,
            identities=copy.desired.identities,
            addresses=copy.desired.addresses,
            last_sync=copy.last_sync,
            pending=self.changes.pending(),
            invalid=copy.invalid,
            state_file_problem=self.dp.state_problem,  # a string, replaced whole: read live
        )
        if kernel:
            doc.update(view.kernel_document(copy.sets, copy.chains))
        return doc

    def port_names(self) -> dict[ServiceKey, PortName]:
        """The Service port of each desired virtual server as of the last sync (the
        per-Service traffic series' names), from ``status``: a scrape never waits for a sync."""
        return port_names(self.status.desired.identities)

    def _invalid(self) -> dict[str, str]:
        """Services that cannot be planned, and those whose programming failed."""
        invalid = dict(self.dp.errors)
        for service, failure in self.dp.failed.items():
            if service:
                why = f"failed to program: {failure.reason}"
                invalid[service] = f"{invalid[service]}; {why}" if service in invalid else why
        return invalid
