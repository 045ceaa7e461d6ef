"""kube-proxy's nftables-mode tables (``ip kube-proxy``, ``ip6 kube-proxy``) are deleted at
start, as upstream's platformCleanup; nothing else is. Over a channel that sends nothing and
answers as the kernel would: a table per (family, name), the requests decoded by pyroute2.

Not in the kernel lab: its UML kernel has nf_tables without a table family (every NEWTABLE is
EOPNOTSUPP, as iptables-nft finds there), so no such table can exist in it."""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Sequence
from typing import Any

import pytest
from pyroute2.netlink.nfnetlink.nftsocket import nft_table_msg

from ipvsproxy.daemon.wiring import remove_nftables_leftovers
from ipvsproxy.kernel import nftables
from ipvsproxy.kernel.fakes.codec import FakeChannel
from ipvsproxy.kernel.netlink import codec
from ipvsproxy.kernel.netlink.sock import Outcome


class KernelTables(FakeChannel):
    """nf_tables' tables, changed by the batches sent (each decoded by pyroute2); a change
    is answered as the kernel answers it (0, or ENOENT for a missing table)."""

    def __init__(self, tables: set[tuple[int, str]]) -> None:
        super().__init__()
        self.tables = tables

    def execute(self, requests: Sequence[tuple[int, bytes]]) -> list[Outcome]:
        self.count(requests)
        return [Outcome(seq, self._apply(data)) for seq, data in requests]

    def _apply(self, data: bytes) -> int:
        begin, change, end = codec.messages(data)
        assert (begin.type, end.type, change.type >> 8) == (0x10, 0x11, 10)
        msg = nft_table_msg(data[change.start - 16 : change.end])
        msg.decode()
        table = (msg["nfgen_family"], msg.get_attr("NFTA_TABLE_NAME"))
        assert change.type & 0xFF == 2  # NFT_MSG_DELTABLE: nothing else is sent
        if table not in self.tables:
            return errno.ENOENT
        self.tables.discard(table)
        return 0


def test_only_kube_proxy_tables_of_ip_and_ip6_are_deleted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "ipvsproxy")
    others = {(nftables.NFPROTO_INET, "kube-proxy"), (nftables.NFPROTO_IPV4, "someone-else")}
    kernel = KernelTables({*nftables.KUBE_PROXY_TABLES, *others})
    remove_nftables_leftovers(lambda: nftables.NFTables(kernel))
    assert kernel.tables == others
    assert caplog.text.count("removed kube-proxy's nftables table") == 2
    caplog.clear()
    remove_nftables_leftovers(lambda: nftables.NFTables(kernel))  # none left: nothing said
    assert kernel.tables == others and caplog.text == ""


def _channel(*answers: int) -> FakeChannel:
    """Answers each request in turn with ``answers`` (errnos; 0: done)."""
    channel = FakeChannel()
    left = list(answers)
    channel.answer = lambda _i: left.pop(0)
    return channel


def test_a_table_deletion_is_a_batch_of_its_own_as_nft_sends_it() -> None:
    data = nftables.delete_table_request(7, nftables.NFPROTO_IPV6, "kube-proxy")
    begin, change, end = codec.messages(data)
    assert [m.type for m in (begin, end)] == [0x10, 0x11]  # NFNL_MSG_BATCH_BEGIN, _END
    # The batch is nf_tables' (its res_id), every message of it has the one seq.
    assert begin.data[begin.start + 2 : begin.start + 4] == socket.htons(10).to_bytes(2, "little")
    assert {m.seq for m in (begin, change, end)} == {7}
    assert change.type == (10 << 8) | 2  # NFT_MSG_DELTABLE
    assert change.flags == codec.NLM_F_REQUEST | codec.NLM_F_ACK
    msg = nft_table_msg(data[change.start - 16 : change.end])
    msg.decode()
    assert msg["nfgen_family"] == nftables.NFPROTO_IPV6
    assert msg.get_attr("NFTA_TABLE_NAME") == "kube-proxy"


def test_kube_proxy_tables_are_deleted_and_missing_ones_are_no_error() -> None:
    nft = nftables.NFTables(_channel(0, errno.ENOENT))
    assert nft.remove_kube_proxy_tables() == (["ip kube-proxy"], [])
    # A kernel without nf_tables has no such table either.
    nft = nftables.NFTables(_channel(errno.EOPNOTSUPP, errno.EOPNOTSUPP))
    assert nft.remove_kube_proxy_tables() == ([], [])


def test_a_table_that_cannot_be_deleted_is_named_and_the_other_still_goes() -> None:
    nft = nftables.NFTables(_channel(errno.EPERM, 0))
    removed, failed = nft.remove_kube_proxy_tables()
    assert removed == ["ip6 kube-proxy"]
    assert failed == ["delete table ip kube-proxy: Operation not permitted"]


def test_at_start_removals_are_logged_and_failures_never_stop_the_daemon(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "ipvsproxy")
    remove_nftables_leftovers(lambda: nftables.NFTables(_channel(0, errno.EPERM)))
    assert "removed kube-proxy's nftables table ip kube-proxy" in caplog.text
    assert "delete table ip6 kube-proxy: Operation not permitted" in caplog.text

    def unavailable() -> nftables.NFTables:
        raise OSError(errno.EPROTONOSUPPORT, "Protocol not supported")

    remove_nftables_leftovers(unavailable)  # logged, not raised
    assert "Protocol not supported" in caplog.text


def test_the_daemon_removes_them_first_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the API client and the kernel backends (upstream: platformCleanup, then the
    proxy server)."""
    from ipvsproxy.config import build
    from ipvsproxy.daemon import wiring

    calls: list[str] = []

    class Stop(Exception):
        pass

    def api_client(_cfg: object) -> None:
        calls.append("api")
        raise Stop

    monkeypatch.setattr(wiring, "set_oom_score_adj", lambda _v: None)
    monkeypatch.setattr(wiring, "_lock_state", lambda _p: None)
    monkeypatch.setattr(wiring, "remove_nftables_leftovers", lambda: calls.append("nftables"))
    monkeypatch.setattr(wiring, "api_client", api_client)

    def opened() -> Any:
        calls.append("backends")

    with pytest.raises(Stop):
        wiring.run(build(None, []), opened)
    assert calls == ["nftables", "api"]
