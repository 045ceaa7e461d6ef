"""Stale UDP conntrack entries, over netlink (pyroute2's ctnetlink: a rare operation).

When a UDP real server goes, conntrack keeps mapping its flows to the dead backend; deleting
those entries moves clients to a live backend at once. Matches upstream's cleanup: entries
whose original destination is the virtual server and whose reply comes from the real server.
"""

from __future__ import annotations

import socket
from typing import Any

from ipvsproxy.backends.errors import Counters
from ipvsproxy.model import DestKey, ServiceKey


class Conntrack:
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

    def forget(self, service: ServiceKey, dest: DestKey) -> int:
        """Delete UDP flows to ``service`` answered by ``dest``; returns how many went."""
        from pyroute2.netlink.nfnetlink.nfctsocket import NFCTAttrTuple

        ct = self._socket()
        orig = NFCTAttrTuple(proto=socket.IPPROTO_UDP, daddr=service.address, dport=service.port)
        reply = NFCTAttrTuple(proto=socket.IPPROTO_UDP, saddr=dest.address)
        deleted = 0
        for entry in list(ct.dump_entries(tuple_orig=orig, tuple_reply=reply)):
            try:
                ct.delete(entry)
            except Exception:  # gone meanwhile: pyroute2 raises its NetlinkError (ENOENT)
                self.counters.count("delete_conntrack", False)
                continue
            self.counters.count("delete_conntrack", True)
            deleted += 1
        return deleted
