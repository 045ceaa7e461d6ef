"""One backend of each kind, as the dataplane holds them: the real ones (``Backends.open()``),
the fakes (``fakes.fake_backends()``), or any mix behind the interfaces."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from ipvsproxy.kernel.addresses import Addresses
from ipvsproxy.kernel.conntrack import Conntrack
from ipvsproxy.kernel.interfaces import (
    AddressBackend,
    ConntrackBackend,
    IPSetBackend,
    IPVSBackend,
    RulesBackend,
    SysctlBackend,
)
from ipvsproxy.kernel.ipset import IPSets
from ipvsproxy.kernel.iptables import FamilyRules, IPTables
from ipvsproxy.kernel.ipvs import IPVS
from ipvsproxy.kernel.sysctl import Sysctls


@dataclass
class Backends:
    ipvs: IPVSBackend
    addresses: AddressBackend
    ipsets: IPSetBackend
    iptables: RulesBackend
    conntrack: ConntrackBackend
    sysctls: SysctlBackend

    @classmethod
    def open(cls) -> KernelBackends:
        """The real backends, on the node's kernel (the calling thread's network namespace),
        with IPv4's rules (``serve_families`` adds IPv6's)."""
        return KernelBackends(IPVS(), Addresses(), IPSets(), IPTables(), Conntrack(), Sysctls())

    def serve_families(self, families: Collection[int]) -> None:
        """Write the rules of ``families``: with IPv6, ip6tables' beside iptables' (the rules
        backend held becomes IPv4's part of a FamilyRules)."""
        if 6 in families and not isinstance(self.iptables, FamilyRules):
            self.iptables = FamilyRules({4: self.iptables, 6: IPTables(family=6)})

    def close(self) -> None:
        self.ipvs.close()
        self.addresses.close()
        self.ipsets.close()
        self.conntrack.close()

    def each(
        self,
    ) -> tuple[
        IPVSBackend, AddressBackend, IPSetBackend, RulesBackend, ConntrackBackend, SysctlBackend
    ]:
        return (self.ipvs, self.addresses, self.ipsets, self.iptables, self.conntrack, self.sysctls)

    def writes(self) -> int:
        return sum(b.counters.writes for b in self.each())


@dataclass
class KernelBackends(Backends):
    """The real backends, typed as such for whoever looks past the interfaces (the lab's
    tests count their sockets' system calls)."""

    ipvs: IPVS
    addresses: Addresses
    ipsets: IPSets
    iptables: IPTables  # IPv4's (serve_families may pair it with IPv6's in a FamilyRules)
    conntrack: Conntrack
    sysctls: Sysctls
