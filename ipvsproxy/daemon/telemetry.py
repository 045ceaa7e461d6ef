"""Telemetry: what each sync reports, in the metrics, the log and Warning Events."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence

from ipvsproxy.daemon.changes import Trigger
from ipvsproxy.dataplane.dataplane import SyncResult
from ipvsproxy.dataplane.snapshot import Snapshot
from ipvsproxy.servers.metrics import FAMILY_LABELS, TRAFFIC_POLICIES, Metrics

log = logging.getLogger("ipvsproxy")

# Keys of the failures among the operations' counts (no operation is named so)
_RESTORE_FAILURES, _STATE_FILE_FAILURES = " restore failures", " state file failures"


class Telemetry:
    """Records each sync: its own figures from its ``SyncResult``, the dataplane's from its
    ``Snapshot`` (the only view of the dataplane it has), a log line and a Warning Event per
    Service that failed, and the sync's errors.

    The snapshot's counters are cumulative; each record adds to the Prometheus counters what
    they grew by since the record before."""

    def __init__(
        self,
        metrics: Metrics,
        warn: Callable[[str, str, str], object],
        wall: Callable[[], float] = time.time,
        families: tuple[int, ...] = (4,),
    ) -> None:
        self.metrics = metrics
        self.families = families  # the IP families served: each sync covers them all
        self.warn = warn  # (service, reason, message): a Warning Event
        self.wall = wall
        self._reported: dict[tuple[str, str], int] = {}  # counter totals already exported

    def changes_pending(self, services: int, slice_changes: int) -> None:
        """The Services with a Service change and the slice changes not yet synced."""
        self.metrics.service_pending.set(services)
        self.metrics.endpoint_pending.set(slice_changes)

    def queued(self) -> None:
        """A change was queued: upstream's proxier of each family sets its gauge."""
        now = self.wall()
        for family in self.families:
            self.metrics.last_queued.labels(FAMILY_LABELS[family]).set(now)

    def record(
        self,
        result: SyncResult,
        snapshot: Snapshot,
        taken: Mapping[str, Sequence[Trigger]],
    ) -> float | None:
        """Record a sync that handled the Services in ``taken`` (-> the trigger times of their
        slice changes). Returns the wall time the sync counts as done at when it ran
        to its end (upstream's proxier then marks itself updated), else None.

        The one sync stands for a sync of each family's proxier: its duration and, when it
        ran to its end, its time are recorded under every family served."""
        for family in self.families:
            self.metrics.sync_duration.labels(FAMILY_LABELS[family]).observe(result.seconds)
        for run in result.conntrack:  # upstream's conntrack reconciler, per family
            label = FAMILY_LABELS[run.family]
            self.metrics.conntrack_duration.labels(label).observe(run.seconds)
            self.metrics.conntrack_deleted.labels(label).inc(run.deleted)
            if run.unfinished:
                log.info(
                    "conntrack cleanup (%s): %d entries deleted, %d UDP virtual servers left "
                    "by the per-sync bound for the next sync",
                    label,
                    run.deleted,
                    run.unfinished,
                )
        self._counters(snapshot)
        self._gauges(snapshot)
        self._report(result)
        if not result.complete:
            return None  # upstream's sync whose iptables-restore failed: not marked updated
        # As upstream, a sync that ran to its end is done, per-object failures included (they
        # are reported above).
        now = self.wall()
        for family in self.families:
            self.metrics.last_sync.labels(FAMILY_LABELS[family]).set(now)
        for triggers in taken.values():
            for trigger in triggers:
                latency = max(0.0, now - trigger.at)
                self.metrics.programming_duration.labels(FAMILY_LABELS[trigger.family]).observe(
                    latency
                )
        log.info(
            "%s sync: %d writes in %.3f s, %d services changed",
            "full" if result.full else "incremental",
            result.writes,
            result.seconds,
            len(taken),
        )
        return now

    def _counters(self, snapshot: Snapshot) -> None:
        """Add to each counter what the snapshot's cumulative count grew by since the last."""
        metrics = self.metrics
        # (operation, outcome) -> count; the failures under keys no operation has
        totals: dict[tuple[str, str], int] = dict(snapshot.operations)
        for family, count in snapshot.restore_failures.items():
            totals[_RESTORE_FAILURES, FAMILY_LABELS[family]] = count
        totals[_STATE_FILE_FAILURES, ""] = snapshot.state_write_failures
        for (kind, outcome), count in totals.items():
            delta = count - self._reported.get((kind, outcome), 0)
            if delta <= 0:
                continue
            if kind == _RESTORE_FAILURES:
                metrics.restore_failures.labels(outcome).inc(delta)
            elif kind == _STATE_FILE_FAILURES:
                metrics.state_write_failures.inc(delta)
            else:
                metrics.netlink_ops.labels(kind, outcome).inc(delta)
        self._reported = totals

    def _gauges(self, snapshot: Snapshot) -> None:
        metrics = self.metrics
        metrics.draining.set(snapshot.draining)
        for family in self.families:
            label = FAMILY_LABELS[family]
            for policy in TRAFFIC_POLICIES:
                count = snapshot.no_local_endpoints.get((policy, family), 0)
                metrics.no_local_endpoints.labels(policy, label).set(count)
        metrics.failed_services.set(snapshot.failed_services)
        metrics.kernel_problems.set(snapshot.kernel_problems)

    def _report(self, result: SyncResult) -> None:
        """A log line and a Warning Event per Service that failed, and the sync's errors."""
        for service, why in sorted(result.failed.items()):
            log.warning("cannot program service %s: %s", service or "(deleted)", why)
            if service:
                self.warn(service, "FailedToProgram", why)
        if result.errors:
            self.metrics.sync_errors.inc()
            for err in result.errors:
                log.error("sync: %s", err)
