"""Stale UDP conntrack entries: when a UDP real server goes, flows that conntrack still maps to
it would keep sending there; deleting them moves clients to a live backend at once."""

from __future__ import annotations

import subprocess

from ipvsproxy.backends.ipvs import Counters
from ipvsproxy.model import DestKey, ServiceKey


class Conntrack:
    def __init__(self, binary: str = "conntrack") -> None:
        self.binary = binary
        self.counters = Counters()

    def forget(self, service: ServiceKey, dest: DestKey) -> None:
        """Delete UDP flows to ``service`` answered by ``dest`` (none found is not an error)."""
        proc = subprocess.run(
            [
                self.binary,
                "-D",
                "-p",
                "udp",
                "--orig-dst",
                service.address,
                "--dport",
                str(service.port),
                "--reply-src",
                dest.address,
            ],
            capture_output=True,
            text=True,
        )
        ok = proc.returncode == 0 or "0 flow entries" in proc.stderr
        self.counters.count("delete_conntrack", ok)
