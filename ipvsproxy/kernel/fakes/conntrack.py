"""A fake of the UDP conntrack entries to each virtual server."""

from __future__ import annotations

from collections.abc import Collection

from ipvsproxy.core.virtual_servers import (
    ServiceKey,
)
from ipvsproxy.kernel.conntrack import stale
from ipvsproxy.kernel.fakes.faults import FakeBackend


class FakeConntrack(FakeBackend[tuple[ServiceKey, str]]):
    """UDP conntrack entries: ``flows`` to each virtual server, each by the address of the
    real server that answers it (seeded: traffic makes them); ``flushes`` records each call
    (service, live, gone). A refusal matches (service, answering address) of one entry."""

    def __init__(self) -> None:
        super().__init__()
        self.flows: dict[ServiceKey, list[str]] = {}
        self.flushes: list[tuple[ServiceKey, frozenset[str], frozenset[str]]] = []

    def add_flow(self, service: ServiceKey, answered_by: str) -> None:
        self.flows.setdefault(service, []).append(answered_by)

    def flush_stale(
        self, service: ServiceKey, live: Collection[str], gone: Collection[str] = ()
    ) -> int:
        self.on_call("flush_stale", service, live, gone)
        self.flushes.append((service, frozenset(live), frozenset(gone)))
        kept: list[str] = []
        deleted = 0
        for source in self.flows.get(service, []):
            if not stale(source, live, gone):
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
