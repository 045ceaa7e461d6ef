"""Stateful fakes of the kernel backends, for tests of the dataplane without a kernel.

Each fake satisfies its interface (``interfaces.py``) and holds its own table of what the
kernel would hold, as upstream kube-proxy's ``FakeIPVS`` does: virtual servers and their real
servers with weights and connection counts, the members of each ipset, the addresses on each
device, the iptables chains' rules, UDP conntrack entries, sysctl values. Every fake

- counts its writes in ``counters`` (``Counters``) by the kinds the real backend uses, so that
  ``SyncResult.writes`` means the same over fakes as over the kernel;
- refuses what the kernel refuses, with the kernel's errno, through the same ``ApplyError``
  and ``Rejected`` as the real backend (the table of refusals is each interface's docstring;
  tests/kernel/test_kernel_conformance.py runs the same scenarios on the fakes and on the lab's
  kernel, so the two cannot drift apart);
- can be told to refuse an operation the kernel would take: ``refuse(errno, where, nth,
  times)`` refuses the ``nth`` operation that ``where`` matches (and ``times - 1`` more after
  it; ``times=None``: all of them) with ``errno``, reported as the kernel reports a refusal;
- can be told to raise from a method: ``raise_from(method, exc, where, times)`` raises ``exc``
  from the next ``times`` calls of ``method`` whose arguments ``where`` matches, before it does
  anything (an ``OSError`` from a dump, pyroute2's ``NetlinkError``, a codec's bug);
- counts its calls by method (``calls``), faults included.

State ipvsproxy did not create (someone else's virtual servers, sets, addresses, chains, and
connections) is seeded with the ``add_*``/``run`` helpers, which count no write. The fakes take
values the real backends' codecs could not encode (a port above 65535): the codec is the real
backends' own, and ``fakes.codec`` runs it over these tables.
"""

from __future__ import annotations

import weakref
from collections.abc import Collection
from dataclasses import dataclass

from ipvsproxy.kernel.backends import Backends
from ipvsproxy.kernel.fakes.addresses import FakeAddresses
from ipvsproxy.kernel.fakes.conntrack import FakeConntrack
from ipvsproxy.kernel.fakes.faults import FakeBackend, Raising, Refusal
from ipvsproxy.kernel.fakes.ipsets import FakeIPSets, SetOp
from ipvsproxy.kernel.fakes.iptables import FakeIPTables
from ipvsproxy.kernel.fakes.ipvs import FakeIPVS
from ipvsproxy.kernel.fakes.sysctls import FakeSysctls

__all__ = [
    "FakeAddresses",
    "FakeBackend",
    "FakeBackends",
    "FakeConntrack",
    "FakeIPSets",
    "FakeIPTables",
    "FakeIPVS",
    "FakeSysctls",
    "Raising",
    "Refusal",
    "SetOp",
    "fake_backends",
    "wire",
]


@dataclass
class FakeBackends(Backends):
    """``Backends`` of fakes, typed as such for the tests that look into their tables."""

    ipvs: FakeIPVS
    addresses: FakeAddresses
    ipsets: FakeIPSets
    iptables: FakeIPTables
    conntrack: FakeConntrack
    sysctls: FakeSysctls


def wire(ipsets: FakeIPSets, iptables: FakeIPTables) -> None:
    """A rule may match only a set that exists, and a set a rule matches cannot be destroyed:
    each fake asks the other (the rules ask through a weak reference: no reference cycle, which
    the daemon's collector policy would keep alive)."""
    sets = weakref.ref(ipsets)

    def existing() -> Collection[str]:
        fake = sets()
        return fake.sets.keys() if fake is not None else ()

    iptables.sets = existing
    ipsets.referenced = iptables.referenced_sets


def fake_backends() -> FakeBackends:
    """A fresh node's kernel, as fakes: no kube-ipvs0, no ipsets, no chains of ours."""
    ipsets, iptables = FakeIPSets(), FakeIPTables()
    wire(ipsets, iptables)
    return FakeBackends(
        FakeIPVS(), FakeAddresses(), ipsets, iptables, FakeConntrack(), FakeSysctls()
    )
