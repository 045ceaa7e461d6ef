"""A fake of the UDP conntrack entries to each virtual server."""

from __future__ import annotations

import socket
from collections.abc import Mapping

from ipvsproxy.core.virtual_servers import ServiceKey
from ipvsproxy.kernel.conntrack import Bounds, Budget, Endpoint, Stale, Unfinished, sweep
from ipvsproxy.kernel.fakes.faults import FakeBackend
from ipvsproxy.kernel.netlink.ct_messages import Flow


class FakeConntrack(FakeBackend[tuple[ServiceKey, Endpoint]]):
    """UDP conntrack entries: ``flows`` to each virtual server, each by the (address, port)
        of the real server that answers it (seeded: traffic makes them); ``flushes`` records each
        target begun (service, live, gone) and ``reads`` the calls. Each call's work is bounded by
        ``bounds`` as the real one's (``conntrack.sweep``, in the targets' order), each target read
    as if alone in its dump. A raising set
        for ``flush_stale`` is matched against each target (service, live, gone) and fails that
        target only; a refusal matches (service, answering endpoint) of one entry."""

    def __init__(self) -> None:
        super().__init__()
        self.flows: dict[ServiceKey, list[Endpoint]] = {}
        self.flushes: list[tuple[ServiceKey, frozenset[Endpoint], frozenset[Endpoint]]] = []
        self.reads = 0
        self.bounds = Bounds()

    def add_flow(self, service: ServiceKey, answered_by: Endpoint) -> None:
        self.flows.setdefault(service, []).append(answered_by)

    def flush_stale(
        self, targets: Mapping[ServiceKey, Stale]
    ) -> dict[ServiceKey, int | Unfinished | Exception]:
        self.reads += 1
        budget = Budget(self.bounds)
        outcomes: dict[ServiceKey, int | Unfinished | Exception] = {}
        for service in sorted(targets):
            why = targets[service]
            if not budget.may_begin():
                outcomes[service] = Unfinished(0)
                continue
            try:
                self.on_call("flush_stale", service, why.live, why.gone)
            except Exception as exc:
                outcomes[service] = exc
                continue
            self.flushes.append((service, frozenset(why.live), frozenset(why.gone)))
            outcomes[service] = self._flush(service, why, budget)
        return outcomes

    def _flush(self, service: ServiceKey, why: Stale, budget: Budget) -> int | Unfinished:
        to = (service.address, service.port)
        budget.dumps += 1
        flows = [Flow(socket.IPPROTO_UDP, to, by, b"") for by in self.flows.get(service, [])]
        doomed, finished = sweep(flows, {to: (service, why)}, budget)
        deleted = 0
        for _, flow in doomed:
            if self._refused((service, flow.answered_by)):
                self.counters.count("delete_conntrack", False)
                continue
            self.counters.count("delete_conntrack", True)
            self.flows[service].remove(flow.answered_by)
            deleted += 1
        return deleted if finished else Unfinished(deleted)

    def close(self) -> None:
        self.on_call("close")
