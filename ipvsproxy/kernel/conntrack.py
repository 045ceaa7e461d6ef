"""Stale UDP conntrack entries, over netlink (pyroute2's ctnetlink).

Upstream's CleanStaleEntries (pkg/proxy/conntrack/cleanup.go): a UDP flow's conntrack entry
outlives the real server that answered it, and one created while the Service had no endpoint
(refused by the node, dropped) skips the nat rules for good: clients stay blackholed until it
expires, which a client sending more often never lets happen. So the entries to a UDP virtual
server that none of its real servers answers are deleted.
"""

from __future__ import annotations

import socket
from collections.abc import Collection, Mapping
from ipaddress import IPv4Address, IPv6Address, ip_address
from typing import Any, NamedTuple

from ipvsproxy.core.virtual_servers import ServiceKey
from ipvsproxy.kernel.errors import Counters


class Stale(NamedTuple):
    """What makes an entry to one UDP virtual server stale: the addresses of its real servers
    (``live``) and of those a sync removed (``gone``)."""

    live: Collection[str]
    gone: Collection[str] = ()


def stale(reply_source: str, live: Collection[str], gone: Collection[str]) -> bool:
    """Whether an entry to a UDP virtual server whose reply comes from ``reply_source`` goes.

    With real servers (``live``, their addresses), every entry none of them answers goes, as
    upstream. Without, upstream keeps every entry; here those answered by the real servers
    just removed (``gone``) go: they answer no more.
    """
    return reply_source not in live if live else reply_source in gone


def family(address: str) -> int:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def _destination(entry: Any) -> tuple[IPv4Address | IPv6Address, int] | None:
    """An entry's original destination (address, port); None for one without them."""
    orig = entry.tuple_orig
    try:
        return ip_address(orig.daddr), int(orig.dport)
    except (TypeError, ValueError):
        return None


class Conntrack:
    """Deletes stale UDP conntrack entries (see ``stale``) through pyroute2's ctnetlink
    sockets, one per address family (a request's nfgen_family must be its entries' family: the
    kernel refuses an IPv6 filter on an IPv4 socket), each opened at first use and kept until
    ``close``.

    Owns those sockets and ``counters``; holds no entries. ``flush_stale`` reads the UDP entries
    of each address family once a call, whatever the number of virtual servers it is given:
    each pyroute2 call sets up and tears down its own transport (docs/performance.md). The
    read is filtered in the kernel for one target, in here for more. A delete that fails (an
    entry gone meanwhile) is counted as failed and skipped; a read the kernel refuses fails
    that family's targets."""

    def __init__(self) -> None:
        self.counters = Counters()
        self._ct: dict[int, Any] = {}  # address family -> its socket

    def _socket(self, fam: int) -> Any:
        if fam not in self._ct:
            from pyroute2 import Conntrack as CT  # imported when first needed: it is slow

            self._ct[fam] = CT(nfgen_family=fam)
        return self._ct[fam]

    def close(self) -> None:
        for ct in self._ct.values():
            ct.close()
        self._ct.clear()

    def flush_stale(self, targets: Mapping[ServiceKey, Stale]) -> dict[ServiceKey, int | Exception]:
        """Delete the UDP entries to each of ``targets`` that are ``stale``; returns how many
        went for each, or the error that failed it."""
        outcomes: dict[ServiceKey, int | Exception] = {}
        for fam in sorted({family(s.address) for s in targets}):
            of_family = {s: why for s, why in targets.items() if family(s.address) == fam}
            try:
                outcomes.update(self._flush_family(fam, of_family))
            except Exception as exc:  # the read: pyroute2 raises its NetlinkError
                outcomes.update(dict.fromkeys(of_family, exc))
        return outcomes

    def _flush_family(self, fam: int, targets: Mapping[ServiceKey, Stale]) -> dict[ServiceKey, int]:
        from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

        ct = self._socket(fam)
        by_dest = {(ip_address(s.address), s.port): s for s in targets}
        deleted = dict.fromkeys(targets, 0)
        match: dict[str, Any] = {"family": fam, "proto": socket.IPPROTO_UDP}
        # The kernel filters one virtual server's entries; an IPv6 address and port in
        # pyroute2's filter match no entry (seen in the lab), so IPv6's are filtered here.
        if len(targets) == 1 and fam == socket.AF_INET:
            (only,) = targets
            match.update(daddr=only.address, dport=only.port)
        for entry in list(ct.dump_entries(tuple_orig=NFCTAttrTuple(**match))):
            dest = _destination(entry)
            service = by_dest.get(dest) if dest is not None else None
            if service is None:
                continue
            why = targets[service]
            if not stale(str(entry.tuple_reply.saddr), why.live, why.gone):
                continue
            try:
                ct.delete(entry)
            except Exception:  # gone meanwhile: pyroute2 raises its NetlinkError (ENOENT)
                self.counters.count("delete_conntrack", False)
                continue
            self.counters.count("delete_conntrack", True)
            deleted[service] += 1
        return deleted
