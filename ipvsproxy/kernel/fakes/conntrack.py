"""A fake of the UDP conntrack entries to each virtual server."""

from __future__ import annotations

from collections.abc import Mapping

from ipvsproxy.core.virtual_servers import ServiceKey
from ipvsproxy.kernel.conntrack import Stale, stale
from ipvsproxy.kernel.fakes.faults import FakeBackend


class FakeConntrack(FakeBackend[tuple[ServiceKey, str]]):
    """UDP conntrack entries: ``flows`` to each virtual server, each by the address of the
    real server that answers it (seeded: traffic makes them); ``flushes`` records each target
    of each call (service, live, gone) and ``reads`` the calls (the real one reads the table
    once a call). A raising set for ``flush_stale`` is matched against each target (service,
    live, gone) and fails that target only; a refusal matches (service, answering address) of
    one entry."""

    def __init__(self) -> None:
        super().__init__()
        self.flows: dict[ServiceKey, list[str]] = {}
        self.flushes: list[tuple[ServiceKey, frozenset[str], frozenset[str]]] = []
        self.reads = 0

    def add_flow(self, service: ServiceKey, answered_by: str) -> None:
        self.flows.setdefault(service, []).append(answered_by)

    def flush_stale(self, targets: Mapping[ServiceKey, Stale]) -> dict[ServiceKey, int | Exception]:
        self.reads += 1
        outcomes: dict[ServiceKey, int | Exception] = {}
        for service, why in targets.items():
            try:
                self.on_call("flush_stale", service, why.live, why.gone)
            except Exception as exc:
                outcomes[service] = exc
                continue
            self.flushes.append((service, frozenset(why.live), frozenset(why.gone)))
            outcomes[service] = self._flush(service, why)
        return outcomes

    def _flush(self, service: ServiceKey, why: Stale) -> int:
        kept: list[str] = []
        deleted = 0
        for source in self.flows.get(service, []):
            if not stale(source, why.live, why.gone):
                kept.append(source)
            elif self._refused((service, source)):
                self.counters.count("delete_conntrack", False)
                kept.append(source)
            else:
                self.counters.count("delete_conntrack", True)
                deleted += 1
        if service in self.flows:
            self.flows[service] = kept
        return deleted

    def close(self) -> None:
        self.on_call("close")
