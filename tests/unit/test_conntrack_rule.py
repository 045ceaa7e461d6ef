"""Which UDP conntrack entries go: upstream's CleanStaleEntries rule (cleanup.go)."""

from __future__ import annotations

from ipvsproxy.kernel.conntrack import stale


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
