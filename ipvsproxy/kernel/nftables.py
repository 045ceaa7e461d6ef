"""The tables an nftables-mode kube-proxy leaves on a node: ``kube-proxy`` in the ``ip`` and
``ip6`` families, removed at start as upstream's platformCleanup does for a node whose proxy is
now IPVS-based (pkg/proxy/nftables CleanupLeftovers: ``delete table``). No other table is
touched, nor any of another family (``inet kube-proxy`` is not kube-proxy's).

Over nfnetlink (include/uapi/linux/netfilter/nf_tables.h), as ``nft delete table`` sends it: a
table's deletion, with everything in it, in a batch of its own (nf_tables takes changes in
batches only).
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator

from ipvsproxy.kernel.netlink import codec
from ipvsproxy.kernel.netlink.sock import NETLINK_NETFILTER, Channel, NetlinkSocket

NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN = 0x10
NFNL_MSG_BATCH_END = 0x11
NFT_MSG_NEWTABLE = 0
NFT_MSG_GETTABLE = 1
NFT_MSG_DELTABLE = 2
NFT_MSG_NEWCHAIN = 3
NFTA_TABLE_NAME = 1
NFTA_CHAIN_TABLE = 1
NFTA_CHAIN_NAME = 3
NFPROTO_INET = 1
NFPROTO_IPV4 = 2
NFPROTO_IPV6 = 10
FAMILY_NAMES = {NFPROTO_INET: "inet", NFPROTO_IPV4: "ip", NFPROTO_IPV6: "ip6"}

KUBE_PROXY_TABLES = ((NFPROTO_IPV4, "kube-proxy"), (NFPROTO_IPV6, "kube-proxy"))
# Answers that mean there is no such table: it is missing (ENOENT), or the kernel has no
# nf_tables (the subsystem is unknown: EOPNOTSUPP; no netfilter netlink: EPROTONOSUPPORT).
ABSENT = frozenset({errno.ENOENT, errno.EOPNOTSUPP, errno.EPROTONOSUPPORT})

_NLMSGHDR = struct.Struct("=IHHII")
_NFGENMSG = struct.Struct("=BBH")


def _message(kind: int, flags: int, seq: int, family: int, res_id: int, attrs: bytes) -> bytes:
    body = _NFGENMSG.pack(family, 0, socket.htons(res_id)) + attrs
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, flags, seq, 0) + body


def batch(seq: int, command: int, family: int, attrs: bytes) -> bytes:
    """One nf_tables change in a batch of its own, every message with ``seq``: the kernel's one
    answer (an ack, or the error of the change or of the batch) carries it."""
    begin = _message(NFNL_MSG_BATCH_BEGIN, codec.NLM_F_REQUEST, seq, 0, NFNL_SUBSYS_NFTABLES, b"")
    change = _message(
        (NFNL_SUBSYS_NFTABLES << 8) | command,
        codec.NLM_F_REQUEST | codec.NLM_F_ACK,
        seq,
        family,
        0,
        attrs,
    )
    end = _message(NFNL_MSG_BATCH_END, codec.NLM_F_REQUEST, seq, 0, NFNL_SUBSYS_NFTABLES, b"")
    return begin + change + end


def delete_table_request(seq: int, family: int, name: str) -> bytes:
    return batch(seq, NFT_MSG_DELTABLE, family, codec.attr_str(NFTA_TABLE_NAME, name))


def list_tables_request(seq: int) -> bytes:
    kind = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETTABLE
    return _message(kind, codec.NLM_F_REQUEST | codec.NLM_F_DUMP, seq, 0, 0, b"")


def parse_table(msg: codec.Message) -> tuple[int, str] | None:
    """(family, name) of one table in a GETTABLE dump."""
    top = codec.attrs_of(msg.data, msg.start + _NFGENMSG.size, msg.end)
    if NFTA_TABLE_NAME not in top:
        return None
    return msg.data[msg.start], codec.get_str(msg.data, top[NFTA_TABLE_NAME])


def describe(family: int, name: str) -> str:
    return f"{FAMILY_NAMES.get(family, str(family))} {name}"


class NFTables:
    """nf_tables over its own netfilter netlink socket: its tables listed, and kube-proxy's
    deleted. Holds nothing but the socket."""

    def __init__(self, sock: Channel | None = None) -> None:
        self.sock: Channel = sock or NetlinkSocket(NETLINK_NETFILTER)

    def close(self) -> None:
        self.sock.close()

    def tables(self) -> Iterator[tuple[int, str]]:
        """(family, name) of every table in this network namespace."""
        seq = self.sock.next_seq()
        for msg in self.sock.dump(list_tables_request(seq), seq):
            table = parse_table(msg)
            if table is not None:
                yield table

    def remove_kube_proxy_tables(self) -> tuple[list[str], list[str]]:
        """Delete kube-proxy's tables, each on its own: (those deleted, why each other one
        that exists could not be)."""
        removed, failed = [], []
        for family, name in KUBE_PROXY_TABLES:
            seq = self.sock.next_seq()
            (outcome,) = self.sock.execute([(seq, delete_table_request(seq, family, name))])
            if outcome.ok:
                removed.append(describe(family, name))
            elif outcome.errno not in ABSENT:
                failed.append(f"delete table {describe(family, name)}: {outcome.message}")
        return removed, failed
