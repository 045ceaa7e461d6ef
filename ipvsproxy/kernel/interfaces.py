"""What the dataplane, the daemon and ``ipvsproxy status`` ask of the node's kernel: one narrow
interface per backend, as upstream kube-proxy's ``ipvs/util.Interface``.

The real backends (ipvs.py, ipset.py, addresses.py, iptables.py, conntrack.py, sysctl.py) and
the stateful fakes (``kernel.fakes``) both satisfy these. The dataplane holds its backends as
``Backends`` (backends.py), typed with these; only ``Backends.open()`` (and ``ipvsproxy
status``, which reads IPVS and kube-ipvs0 once) builds real ones. Each interface lists exactly
the methods and attributes used above the kernel layer; a backend's others (its socket, its
encoder) are its own.

Shared by every backend that writes:

- ``counters`` counts every write by kind and outcome (``Counters``), a refused one too; the
  dataplane's ``SyncResult.writes`` is the difference of their sums.
- An ``apply`` applies the operations in order and returns how many it applied. When the
  kernel refuses some, the others are applied all the same, and ``ApplyError`` names each
  refused one (``Rejected``: what, and the kernel's errno) with its position in the batch
  (``ApplyError.failed``). Anything else raised (a codec's ``struct.error``, pyroute2's
  ``NetlinkError``, ``OSError``) means the outcome of the batch is unknown.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.diff import AddressOp, DestOp, MemberOp, ServiceOp
from ipvsproxy.core.ruleset import Jump
from ipvsproxy.core.virtual_servers import (
    DestKey,
    ObservedDest,
    Seen,
    ServiceKey,
    Traffic,
    VirtualServer,
)
from ipvsproxy.kernel.conntrack import Stale, Unfinished
from ipvsproxy.kernel.errors import Counters
from ipvsproxy.kernel.iptables import Observed


class IPVSBackend(Protocol):
    """IPVS virtual servers and their real servers, every one on the node: whose they are is
    the dataplane's business (its state file, kube-ipvs0), not this interface's.

    ``apply`` takes ``ServiceOp`` and ``DestOp`` and the kernel refuses, by errno: adding what
    exists (EEXIST); changing or deleting a virtual server that does not exist, or any real
    server operation on one (ESRCH); a scheduler it does not have, changing or deleting a real
    server that does not exist (ENOENT); a real server that is not a unicast IPv4 address
    (EINVAL; any port is taken, 0 too). Deleting a virtual server deletes its real servers.
    Reads return what the kernel holds now: a virtual server with the flags the kernel adds
    (``SVC_F_HASHED``) and its persistence netmask as a prefix length, a real server with its
    weight, forwarding method and connection counts.
    """

    counters: Counters

    def services(self) -> dict[ServiceKey, VirtualServer]: ...

    def each_service(self) -> Iterator[VirtualServer]:
        """``services`` one at a time, as the dump comes."""
        ...

    def dests(self, key: ServiceKey) -> dict[DestKey, Seen]:
        """The real servers of ``key`` (none when it does not exist)."""
        ...

    def services_with_traffic(self) -> dict[ServiceKey, tuple[VirtualServer, Traffic]]: ...

    def dests_with_traffic(
        self, key: ServiceKey
    ) -> dict[DestKey, tuple[ObservedDest, Traffic]]: ...

    def apply(self, ops: Sequence[ServiceOp | DestOp]) -> int: ...

    def read_timeouts(self) -> tuple[int, int, int]:
        """``ipvsadm -L --timeout``: (tcp, tcpfin, udp) in seconds."""
        ...

    def set_timeouts(self, tcp: int, tcp_fin: int, udp: int) -> None:
        """``ipvsadm --set``; a refusal raises ApplyError."""
        ...

    def close(self) -> None: ...


class IPSetBackend(Protocol):
    """The ipsets with ipvsproxy's names (``ipset_specs.NAMES``, upstream's): only those are
    read, created and destroyed; sets of any other name are invisible here and never touched.

    ``apply`` takes ``MemberOp`` and the kernel refuses, with ipset's own codes above 4096
    (``ipset_messages.ERRORS``): adding an entry that is there or deleting one that is not
    (4103), an entry its type cannot hold (a /0 net: 4104; a port out of a bitmap's range:
    4352); and a member of a set that does not exist (ENOENT). The kernel holds an entry in
    its canonical form (a net with its prefix, host bits cleared), which is what reads return
    and what an operation matches.
    """

    counters: Counters

    def read(self) -> dict[str, set[str]]:
        """The members of every set of ours that exists."""
        ...

    def each_part(self) -> Iterator[tuple[str, list[str]]]:
        """``read`` as the dump comes: (set name, some entries), a set's parts in a row, and
        at least one part for every set of ours that exists."""
        ...

    def ensure(self, existing: Collection[str], names: Iterable[str] = ipset_specs.NAMES) -> int:
        """Create the sets of ``names`` not in ``existing`` (what the caller read), at the
        newest revision of their type; returns how many. A set that exists after all (EEXIST),
        or a type the kernel lacks (4098), raises ApplyError naming the set."""
        ...

    def apply(self, ops: Sequence[MemberOp]) -> int: ...

    def destroy(self, names: Iterable[str]) -> None:
        """Flush and destroy the sets of ``names`` that are ours (``ipvsproxy cleanup``);
        a refusal (a set missing: ENOENT; one an iptables rule matches: 4100) raises
        ApplyError, and the others are destroyed."""
        ...

    def close(self) -> None: ...


class AddressBackend(Protocol):
    """The dummy device kube-ipvs0, which is ipvsproxy's (every address on it is a Service's,
    but the excludeCIDRs), and the node's addresses on every device.

    ``apply`` takes ``AddressOp`` for kube-ipvs0, creating the device first if it is missing
    (down, as upstream keeps it), and the kernel refuses binding an address that is bound
    (EEXIST) and unbinding one that is not (EADDRNOTAVAIL).
    """

    counters: Counters

    def bound(self) -> set[str]:
        """The addresses on kube-ipvs0 (none when it does not exist)."""
        ...

    def indexed(self) -> list[tuple[int, str]]:
        """(interface index, address) of every address on the node, kube-ipvs0's too (IPv6
        ones as well)."""
        ...

    def device_index(self) -> int | None:
        """kube-ipvs0's interface index; None when it does not exist."""
        ...

    def apply(self, ops: Sequence[AddressOp]) -> int: ...

    def remove_device(self) -> None:
        """Delete kube-ipvs0 with whatever is bound to it; nothing when it does not exist."""
        ...

    def close(self) -> None: ...


class RulesBackend(Protocol):
    """ipvsproxy's iptables chains (those ``ruleset`` names) and its jumps into them from the
    built-in chains (``ruleset.JUMPS``); every other chain and rule is left as it is.

    ``apply`` is one ``iptables-restore --noflush`` transaction: each chain the text declares
    is flushed and rewritten, the missing jumps are inserted first in their chains, and
    nothing else changes. A refused transaction (a rule naming a set or a chain that does not
    exist, a syntax error) changes nothing, counts one failed restore and raises ApplyError.
    """

    @property
    def counters(self) -> Counters: ...

    @property
    def restore_failures(self) -> int:
        """Transactions refused, for the metrics."""
        ...

    def read(self) -> Observed:
        """A digest of our chains as the kernel shows them, and the jumps missing; raises
        OSError when ``iptables-save`` cannot be run."""
        ...

    def missing_jumps_checked(self) -> tuple[Jump, ...]:
        """The jumps not in place, checked one at a time (for when ``read`` fails)."""
        ...

    def apply(self, text: str, missing_jumps: Sequence[Jump] = ()) -> None: ...

    def remove(self) -> None:
        """Delete our jumps and chains (cleanup); those absent are fine."""
        ...


class ConntrackBackend(Protocol):
    """UDP conntrack entries to the virtual servers, as upstream's CleanStaleEntries."""

    counters: Counters

    def flush_stale(
        self, targets: Mapping[ServiceKey, Stale]
    ) -> dict[ServiceKey, int | Unfinished | Exception]:
        """For each UDP virtual server of ``targets``, delete its entries that
        ``conntrack.stale`` says go (answered by none of its ``live`` real servers, or by one
        of those ``gone`` when none is live; each an address and port). Each target is read
        from the kernel filtered to its entries, one at a time, and the call's work is bounded
        (``conntrack.Bounds``). Returns each target's outcome: how many of its entries went,
        Unfinished (how many went) for one the bounds stopped or left for the next call, or
        the error that failed it. An entry that went meanwhile is counted as failed."""
        ...

    def close(self) -> None: ...


class SysctlBackend(Protocol):
    """Kernel settings under /proc/sys, by their path there ("net/ipv4/ip_forward"), and the
    conntrack hash size, by its path under /sys (``sysctl.HASHSIZE``)."""

    counters: Counters

    def read(self, names: Mapping[str, object]) -> dict[str, str]:
        """The current value of each of ``names`` (its keys); a setting the kernel does not
        have raises OSError."""
        ...

    def raise_to(self, floors: Mapping[str, int]) -> list[str]:
        """Write each of ``floors`` whose setting is below it (or cannot be read), in order,
        never lowering one; returns the names written. A write refused raises OSError, and
        those before it stay written."""
        ...

    def ensure(self, values: Mapping[str, str]) -> list[str]:
        """Write those of ``values`` that differ, in order; returns the names written. A
        write refused (a read-only setting in a network namespace) raises OSError, and
        those before it stay written."""
        ...
