"""Per-Service traffic metrics, opt-in (``--service-traffic-metrics N``): what IPVS counted for
each Service port (connections, packets and bytes in and out, over all its virtual servers:
cluster IPs, node ports, external and load-balancer IPs), read from the kernel at each scrape.
kube-router exports the like; upstream kube-proxy has none."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ipvsproxy.core.identities import ServiceIdentity
from ipvsproxy.core.virtual_servers import ServiceKey, Traffic


class PortName(NamedTuple):
    """A Service port, as its series are labelled."""

    namespace: str
    service: str
    port: str  # the port's name, or its number when unnamed
    protocol: str


def port_names(identities: Mapping[str, ServiceIdentity]) -> dict[ServiceKey, PortName]:
    """The Service port of each virtual server the ``identities`` (the daemon's desired
    state's) name."""
    out = {}
    for identity in identities.values():
        for key, vs in identity.virtual_servers.items():
            namespace, _, name = vs.service.partition("/")
            out[key] = PortName(namespace, name, vs.port_name or str(vs.port), key.protocol.value)
    return out


_LABELS = list(PortName._fields)
_COUNTS = 5  # connections, packets in and out, bytes in and out


def _counts(t: Traffic) -> tuple[int, ...]:
    return t.connections, t.in_packets, t.out_packets, t.in_bytes, t.out_bytes


class ServiceTraffic(Collector):
    """Reads ``read()`` (each virtual server's IPVS counters) and ``names()`` (the Service port
    of each of ipvsproxy's virtual servers) at every collect.

    Invariants, under ``lock``:
    - a Service port's totals only grow while the process lives: each virtual server's counters
      are followed from collect to collect and what they grew by is added (one made again
      counts from 0; one gone adds nothing more);
    - at most ``limit`` Service ports have totals (and series): those that have one keep it
      while the Service port has a virtual server; free places go to the others in name order;
      ``left_out`` is how many Service ports have none."""

    def __init__(
        self,
        limit: int,
        read: Callable[[], Mapping[ServiceKey, Traffic]],
        names: Callable[[], Mapping[ServiceKey, PortName]],
    ) -> None:
        self.limit = limit
        self.read = read
        self.names = names
        self.lock = threading.Lock()
        self.last: dict[ServiceKey, tuple[int, ...]] = {}  # counters at the last collect
        self.totals: dict[PortName, list[int]] = {}
        self.left_out = 0

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            names = self.names()
            self._admit(set(names.values()))
            self._add(self.read(), names)
            yield from self._families()

    def _admit(self, ports: set[PortName]) -> None:
        """Totals for the Service ports there are, at most ``limit``."""
        for gone in set(self.totals) - ports:
            del self.totals[gone]
        free = max(0, self.limit - len(self.totals))
        new = sorted(ports - set(self.totals))
        for port in new[:free]:
            self.totals[port] = [0] * _COUNTS
        self.left_out = max(0, len(new) - free)

    def _add(self, now: Mapping[ServiceKey, Traffic], names: Mapping[ServiceKey, PortName]) -> None:
        """What each named virtual server's counters grew by, to its Service port's totals."""
        last, self.last = self.last, {}
        for key, traffic in now.items():
            port = names.get(key)
            if port is None:
                continue
            counts = self.last[key] = _counts(traffic)
            before = last.get(key, (0,) * _COUNTS)
            if any(c < b for c, b in zip(counts, before, strict=True)):
                before = (0,) * _COUNTS  # made again since: counted from 0
            totals = self.totals.get(port)
            if totals is not None:
                for i, (c, b) in enumerate(zip(counts, before, strict=True)):
                    totals[i] += c - b

    def _families(self) -> Iterator[Metric]:
        conns = CounterMetricFamily(
            "ipvsproxy_service_connections",
            "Connections IPVS scheduled to a Service port's virtual servers",
            labels=_LABELS,
        )
        packets = CounterMetricFamily(
            "ipvsproxy_service_packets",
            "Packets through a Service port's virtual servers, by direction",
            labels=[*_LABELS, "direction"],
        )
        octets = CounterMetricFamily(
            "ipvsproxy_service_bytes",
            "Bytes through a Service port's virtual servers, by direction",
            labels=[*_LABELS, "direction"],
        )
        for port, (c, p_in, p_out, b_in, b_out) in sorted(self.totals.items()):
            conns.add_metric(list(port), c)
            for direction, p, b in (("in", p_in, b_in), ("out", p_out, b_out)):
                packets.add_metric([*port, direction], p)
                octets.add_metric([*port, direction], b)
        yield from (conns, packets, octets)
        yield GaugeMetricFamily(
            "ipvsproxy_service_traffic_ports_left_out",
            "Service ports without traffic series (beyond --service-traffic-metrics)",
            value=self.left_out,
        )
