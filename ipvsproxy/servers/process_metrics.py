"""The process_* series upstream's Go client (client_golang's process collector, over procfs)
exports and prometheus_client's ProcessCollector does not: the address-space limit and the
bytes the process's network namespace received and sent (/proc/self/net/netstat's IpExt
InOctets and OutOctets, as procfs reads them). Each is left out when its file cannot be
read, as the Go collector reports an error for it instead."""

from __future__ import annotations

import itertools
import resource
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

UNLIMITED = 18446744073709551615  # procfs' value for "unlimited"


class ProcessExtras(Collector):
    def __init__(self, proc: Path = Path("/proc/self")) -> None:
        self.proc = proc

    def collect(self) -> Iterator[Metric]:
        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
        yield GaugeMetricFamily(
            "process_virtual_memory_max_bytes",
            "Maximum amount of virtual memory available in bytes.",
            value=float(UNLIMITED if soft == resource.RLIM_INFINITY else soft),
        )
        octets = self.octets()
        if octets is None:
            return
        yield CounterMetricFamily(
            "process_network_receive_bytes",
            "Number of bytes received by the process over the network.",
            value=octets[0],
        )
        yield CounterMetricFamily(
            "process_network_transmit_bytes",
            "Number of bytes sent by the process over the network.",
            value=octets[1],
        )

    def octets(self) -> tuple[float, float] | None:
        """IpExt's InOctets and OutOctets (0 where absent, as procfs); None when the file
        cannot be read."""
        try:
            lines = (self.proc / "net" / "netstat").read_text().splitlines()
        except OSError:
            return None
        for names, values in itertools.pairwise(lines):
            if names.startswith("IpExt:") and values.startswith("IpExt:"):
                row = dict(zip(names.split()[1:], values.split()[1:], strict=False))
                return float(row.get("InOctets", 0)), float(row.get("OutOctets", 0))
        return 0.0, 0.0
