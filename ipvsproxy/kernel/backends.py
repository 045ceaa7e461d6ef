"""One backend of each kind, as the dataplane holds them: the real ones (``Backends.open()``),
the fakes (``fakes.fake_backends()``), or any mix behind the interfaces."""

from __future__ import annotations

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
from ipvsproxy.kernel.iptables import IPTables
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
        """The real backends, on the node's kernel (the calling thread's network namespace)."""
        return KernelBackends(IPVS(), Addresses(), IPSets(), IPTables(), Conntrack(), Sysctls())

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
    iptables: IPTables
    conntrack: Conntrack
    sysctls: Sysctls
