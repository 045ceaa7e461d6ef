"""Which UDP conntrack entries go: upstream's CleanStaleEntries rule (cleanup.go)."""

from __future__ import annotations

import socket
from types import SimpleNamespace

from ipvsproxy.core.virtual_servers import Protocol, ServiceKey
from ipvsproxy.kernel.conntrack import Conntrack, Stale, stale


def test_with_endpoints_every_entry_no_endpoint_answers_goes() -> None:
    live = {"10.244.1.11", "10.244.2.11"}
    assert not stale("10.244.1.11", live, ())
    assert stale("10.244.3.11", live, ())  # an endpoint gone long ago
    assert stale("10.96.0.10", live, ())  # refused or dropped before: never NATed
    assert stale("10.244.3.11", live, {"10.244.3.11"})


def test_without_endpoints_only_the_entries_of_removed_ones_go() -> None:
    assert stale("10.244.1.11", set(), {"10.244.1.11"})
    assert not stale("10.244.2.11", set(), {"10.244.1.11"})
    assert not stale("10.96.0.10", set(), ())  # as upstream: nothing to flush towards


class _Entry:
    def __init__(self, daddr: object, dport: object, reply_source: str) -> None:
        self.tuple_orig = SimpleNamespace(daddr=daddr, dport=dport)
        self.tuple_reply = SimpleNamespace(saddr=reply_source)


class _Socket:
    """pyroute2's Conntrack as flush_stale uses it: a dump, and deletes it records."""

    def __init__(self, entries: list[_Entry]) -> None:
        self.entries, self.deleted = entries, list[_Entry]()

    def dump_entries(self, tuple_orig: object) -> list[_Entry]:
        return self.entries

    def delete(self, entry: _Entry) -> None:
        self.deleted.append(entry)


def test_an_entry_without_a_readable_destination_is_skipped_not_fatal() -> None:
    """One odd entry in the table (no address, no port) costs nothing to the others."""
    odd = [_Entry(None, 53, "10.244.9.9"), _Entry("10.96.0.10", None, "10.244.9.9")]
    stale_one = _Entry("10.96.0.10", 53, "10.244.9.9")
    sock = _Socket([*odd, stale_one])
    ct = Conntrack()
    ct._ct = {socket.AF_INET: sock}
    dns, other = (
        ServiceKey("10.96.0.10", Protocol.UDP, 53),
        ServiceKey("10.96.0.11", Protocol.UDP, 53),
    )
    out = ct.flush_stale({dns: Stale({"10.244.1.11"}), other: Stale({"10.244.1.11"})})
    assert out == {dns: 1, other: 0}
    assert sock.deleted == [stale_one]
