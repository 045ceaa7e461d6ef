"""Stale UDP conntrack entries, over netlink (pyroute2's ctnetlink: a rare operation).

Upstream's CleanStaleEntries (pkg/proxy/conntrack/cleanup.go): a UDP flow's conntrack entry
outlives the real server that answered it, and one created while the Service had no endpoint
(refused by the node, dropped) skips the nat rules for good: clients stay blackholed until it
expires, which a client sending more often never lets happen. So the entries to a UDP virtual
server that none of its real servers answers are deleted.
"""

from __future__ import annotations

import socket
from collections.abc import Collection
from typing import Any

from ipvsproxy.core.virtual_servers import ServiceKey
from ipvsproxy.kernel.errors import Counters


def stale(reply_source: str, live: Collection[str], gone: Collection[str]) -> bool:
    """Whether an entry to a UDP virtual server whose reply comes from ``reply_source`` goes.

    With real servers (``live``, their addresses), every entry none of them answers goes, as
    upstream. Without, upstream keeps every entry; here those answered by the real servers
    just removed (``gone``) go: they answer no more.
    """
    return reply_source not in live if live else reply_source in gone


class Conntrack:
    """Deletes stale UDP conntrack entries (see ``stale``) through pyroute2's ctnetlink socket,
    opened at first use and kept until ``close``.

    Owns that socket and ``counters``; holds no entries. ``flush_stale`` reads only the UDP
    entries to the one virtual server it is given and returns how many it deleted; a delete
    that fails (an entry gone meanwhile) is counted as failed and skipped, while a dump the
    kernel refuses raises pyroute2's error."""

    def __init__(self) -> None:
        self.counters = Counters()
        self._ct: Any = None

    def _socket(self) -> Any:
        if self._ct is None:
            from pyroute2 import Conntrack as CT  # imported when first needed: it is slow

            self._ct = CT()
        return self._ct

    def close(self) -> None:
        if self._ct is not None:
            self._ct.close()
            self._ct = None

    def flush_stale(
        self, service: ServiceKey, live: Collection[str], gone: Collection[str] = ()
    ) -> int:
        """Delete the UDP entries to ``service`` that are ``stale``; returns how many went."""
        from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

        ct = self._socket()
        orig = NFCTAttrTuple(proto=socket.IPPROTO_UDP, daddr=service.address, dport=service.port)
        deleted = 0
        for entry in list(ct.dump_entries(tuple_orig=orig)):
            if not stale(str(entry.tuple_reply.saddr), live, gone):
                continue
            try:
                ct.delete(entry)
            except Exception:  # gone meanwhile: pyroute2 raises its NetlinkError (ENOENT)
                self.counters.count("delete_conntrack", False)
                continue
            self.counters.count("delete_conntrack", True)
            deleted += 1
        return deleted
