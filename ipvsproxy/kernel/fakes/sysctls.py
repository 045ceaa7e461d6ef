"""A fake of /proc/sys."""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping

from ipvsproxy.kernel.fakes.faults import FakeBackend
from ipvsproxy.kernel.sysctl import HASHSIZE, below

# A fresh node's kernel: ip_vs just loaded, conntrack at its own defaults.
FRESH_NODE = {
    "net/ipv4/vs/conntrack": "0",
    "net/ipv4/vs/expire_nodest_conn": "0",
    "net/ipv4/vs/expire_quiescent_template": "0",
    "net/ipv4/vs/conn_reuse_mode": "1",
    "net/ipv4/ip_forward": "0",
    "net/ipv4/conf/all/arp_ignore": "0",
    "net/ipv4/conf/all/arp_announce": "0",
    "net/ipv6/conf/all/forwarding": "1",  # as a Kubernetes node has it (kubeadm checks it)
    "net/netfilter/nf_conntrack_max": "65536",  # a node of 1 to 4 GiB: the kernel's default
    HASHSIZE: "65536",
    "net/netfilter/nf_conntrack_tcp_timeout_established": "432000",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait": "60",
    "net/netfilter/nf_conntrack_udp_timeout": "30",
    "net/netfilter/nf_conntrack_udp_timeout_stream": "120",
    "net/netfilter/nf_conntrack_tcp_be_liberal": "0",
}


class FakeSysctls(FakeBackend[str]):
    """Settings by their path under /proc/sys (``values``; a fresh node's by default); a
    refusal matches a setting's name and refuses its write."""

    def __init__(self, values: Mapping[str, str] = FRESH_NODE) -> None:
        super().__init__()
        self.values = dict(values)

    def read(self, names: Mapping[str, object]) -> dict[str, str]:
        self.on_call("read", names)
        missing = [n for n in names if n not in self.values]
        if missing:
            code = errno.ENOENT
            raise FileNotFoundError(code, os.strerror(code), f"/proc/sys/{missing[0]}")
        return {n: self.values[n] for n in names}

    def ensure(self, values: Mapping[str, str]) -> list[str]:
        self.on_call("ensure", values)
        current = self.read(values)
        written = []
        for name, value in values.items():
            if current[name] != value:
                self._write(name, value)
                written.append(name)
        return written

    def raise_to(self, floors: Mapping[str, int]) -> list[str]:
        self.on_call("raise_to", floors)
        written = []
        for name, floor in floors.items():
            if below(self.values.get(name), floor):
                self._write(name, str(floor))
                written.append(name)
        return written

    def _write(self, name: str, value: str) -> None:
        refused = self._refused(name)
        if refused:
            path = name if name.startswith("/") else f"/proc/sys/{name}"
            raise OSError(refused, os.strerror(refused), path)
        self.values[name] = value
        self.counters.count("sysctl", True)
