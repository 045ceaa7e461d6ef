"""Graceful termination and stale UDP flows.

A real server no Service wants any more stays in the kernel at weight 0 while its connections
end: it is deleted once idle, or once its grace period has passed since it was first recorded
unwanted (the state file's ``draining_since``, kept by ``observed.record_ipvs``). A UDP virtual
server whose real servers changed has its stale conntrack entries flushed at the sync's end
(upstream's CleanStaleEntries); a flush that fails fails that Service only, and is done again
at its retry.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ipvsproxy.core.desired import DesiredState
from ipvsproxy.core.diff import DestOp, OpKind, ServiceOp, diff_dests
from ipvsproxy.core.virtual_servers import DestKey, Seen, ServiceKey
from ipvsproxy.dataplane.batching import apply_and_record, apply_chunks, isolating
from ipvsproxy.dataplane.blame import Blame
from ipvsproxy.dataplane.observed import Observed
from ipvsproxy.dataplane.statefile import State
from ipvsproxy.kernel.conntrack import Stale, Unfinished
from ipvsproxy.kernel.errors import ApplyError

if TYPE_CHECKING:
    from ipvsproxy.dataplane.dataplane import Backends


def expired(
    key: ServiceKey,
    have: Mapping[DestKey, Seen],
    draining_since: Mapping[tuple[ServiceKey, DestKey], float],
    now: float,
    grace_seconds: float,
) -> set[DestKey]:
    """The real servers of ``key`` (of those the kernel has) whose grace period has passed
    at ``now``; one not draining yet starts its grace now."""
    if not draining_since:  # nothing drains: each one's grace starts now
        return set(have) if now - now >= grace_seconds else set()
    return {d for d in have if now - draining_since.get((key, d), now) >= grace_seconds}


def drain(
    obs: Observed,
    state: State,
    desired: DesiredState,
    backends: Backends,
    *,
    expired: Callable[[ServiceKey, Mapping[DestKey, Seen]], set[DestKey]],
    record: Callable[[list[ServiceOp | DestOp]], None],
    blame: Blame,
) -> None:
    """Real servers at weight 0: delete them once idle or past their grace period, read
    back with the kernel's current connection counts. The draining real servers of a virtual
    server that is gone are forgotten."""
    services = sorted({s for s, _ in state.draining_since})

    def apply(chunk: list[ServiceKey]) -> int:
        ops: list[ServiceOp | DestOp] = []
        for key in chunk:
            if key not in obs.services:
                for dkey in [d for d in state.draining_since if d[0] == key]:
                    del state.draining_since[dkey]
                continue
            obs.dests[key] = have = backends.ipvs.dests(key)
            want = desired.real_servers.get(key, {})
            deletes = diff_dests(key, want, have, expired(key, have))
            ops += [op for op in deletes if op.kind is OpKind.DELETE]
        try:
            apply_and_record(backends.ipvs.apply, ops, record)
        except ApplyError as exc:
            blame.refused(ops, exc)
            raise
        return len(ops)

    def fail(key: ServiceKey, exc: Exception) -> None:
        blame.service(key, f"draining {key}: {type(exc).__name__}: {exc}")

    apply_chunks([services] if services else [], isolating(apply, fail))


@dataclass(frozen=True)
class FlushRun:
    """One family's flush of stale UDP flows in a sync (upstream's conntrack reconciler)."""

    family: int  # 4 or 6
    seconds: float
    deleted: int  # conntrack entries deleted
    unfinished: int = 0  # virtual servers the flush's bounds left for the next sync


class StaleUdpFlows:
    """The UDP virtual servers whose real servers a sync changed, each with the real servers
    removed: their conntrack entries are flushed at the sync's end. A flush's work is bounded
    (``conntrack.Bounds``): the virtual servers it did not finish are flushed again at the
    next sync (``unfinished``), which is due at once."""

    def __init__(self) -> None:
        self.changed: dict[ServiceKey, set[DestKey]] = {}  # filled by ``observed.record_ipvs``
        # Those whose flush failed: flushed again when their Service's retry is due.
        self.failed: dict[ServiceKey, set[DestKey]] = {}
        # Those a flush's bounds stopped: flushed again at the next sync.
        self.unfinished: dict[ServiceKey, set[DestKey]] = {}

    def retry(self, keys: Collection[ServiceKey]) -> None:
        """The failed flushes of the virtual servers ``keys`` (being retried) are done again
        at this sync's end: a retry that finds the virtual server as desired writes nothing,
        and the stale entries would stay."""
        for key in keys:
            gone = self.failed.pop(key, None)
            if gone is not None:
                self.changed.setdefault(key, set()).update(gone)

    def flush(self, backends: Backends, desired: DesiredState, blame: Blame) -> list[FlushRun]:
        """Upstream's CleanStaleEntries for the UDP virtual servers whose real servers this
        sync changed: one ``backends.conntrack.flush_stale`` per family, each a run (its
        time and the entries it deleted, as upstream's proxier of that family reports its
        own); a failure fails the Services it names only (a failed read, each of them)."""
        changed, self.changed = self.changed, {}
        for key, gone in self.unfinished.items():
            changed.setdefault(key, set()).update(gone)
        self.unfinished = {}
        runs = []
        for fam in sorted({6 if ":" in s.address else 4 for s in changed}):
            of_family = {s: gone for s, gone in changed.items() if (":" in s.address) == (fam == 6)}
            start = time.monotonic()
            deleted = self._flush(of_family, backends, desired, blame)
            if deleted is not None:
                left = sum(1 for s in of_family if s in self.unfinished)
                runs.append(FlushRun(fam, time.monotonic() - start, deleted, left))
        return runs

    def _flush(
        self,
        changed: Mapping[ServiceKey, set[DestKey]],
        backends: Backends,
        desired: DesiredState,
        blame: Blame,
    ) -> int | None:
        """One family's flush: the entries deleted, None when none of its Services could be
        flushed (upstream reports no run whose read failed)."""
        targets = {
            service: Stale(set(desired.real_servers.get(service, {})), gone)
            for service, gone in changed.items()
        }
        try:
            outcomes = backends.conntrack.flush_stale(targets)
        except Exception as exc:
            outcomes = dict.fromkeys(targets, exc)
        for service, outcome in sorted(outcomes.items()):
            if isinstance(outcome, Exception):
                why = f"conntrack cleanup of {service}: {type(outcome).__name__}: {outcome}"
                self.failed.setdefault(service, set()).update(changed[service])
                blame.service(service, why)
            elif isinstance(outcome, Unfinished):
                self.unfinished[service] = changed[service]
        counts = [
            n.deleted if isinstance(n, Unfinished) else n
            for n in outcomes.values()
            if not isinstance(n, Exception)
        ]
        return sum(counts) if counts else None
