"""Sets of other owners on the node (Calico's ``hash:net`` ``cali40masq-ipam-pools``,
``hash:net,iface``, ``hash:mac``, ``list:set``, ``bitmap:ip``) never stop the reading of
ipvsproxy's own: their members are not decoded, and a member of a shape the codec does not know
is skipped. Over a real kernel's list replies (tests/unit/fixtures/ipset-list-foreign.hex) fed to
the real ``IPSets`` backend through a channel that sends nothing."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

from ipvsproxy.core import ipset_specs
from ipvsproxy.kernel.fakes.codec import FakeChannel
from ipvsproxy.kernel.ipset import IPSets
from ipvsproxy.kernel.netlink import codec, ipset_messages

FIXTURE = Path(__file__).parent / "fixtures" / "ipset-list-foreign.hex"

OURS = {
    "KUBE-CLUSTER-IP": {"10.96.0.10,tcp:80"},
    "KUBE-NODE-PORT-TCP": {"30080"},
    "KUBE-LOOP-BACK": {"10.244.1.5,tcp:8080,10.244.1.5"},
    "KUBE-LOAD-BALANCER-SOURCE-CIDR": {"203.0.113.5,tcp:443,192.0.2.0/24"},
    "KUBE-IPVS-IPS": {"10.96.0.10"},
    "KUBE-6-CLUSTER-IP": {"fd00:10:96::a,udp:53"},
}
FOREIGN = {"cali40masq-ipam-pools", "foreign-net-iface", "foreign-bitmap-ip", "foreign-list"}


class DumpChannel(FakeChannel):
    """Answers every dump with ``replies`` (whole netlink messages), as the kernel would."""

    def __init__(self, replies: list[bytes]) -> None:
        super().__init__()
        self.replies = replies

    def dump(self, request: bytes, seq: int) -> Iterator[codec.Message]:
        for reply in self.replies:
            yield from codec.messages(reply)


def _captured() -> list[bytes]:
    lines = FIXTURE.read_text().splitlines()
    return [bytes.fromhex(line) for line in lines if line and not line.startswith("#")]


def _names(replies: list[bytes]) -> set[str]:
    names = set()
    for reply in replies:
        for msg in codec.messages(reply):
            top = codec.attrs_of(msg.data, msg.start + 4, msg.end)
            names.add(codec.get_str(msg.data, top[ipset_messages.ATTR_SETNAME]))
    return names


def _reply(name: str, set_type: str | None, *members: bytes) -> bytes:
    """A list reply as the kernel builds one (ip_set_dump_do): the type only in a set's first
    message, the members in IPSET_ATTR_ADT."""
    body = (
        b"\2\0\0\0"  # nfgenmsg: AF_INET, version 0, res_id 0
        + codec.attr(ipset_messages.ATTR_PROTOCOL, b"\7")
        + codec.attr_str(ipset_messages.ATTR_SETNAME, name)
    )
    if set_type is not None:
        body += codec.attr_str(ipset_messages.ATTR_TYPENAME, set_type)
    adt = b"".join(codec.nested(ipset_messages.ATTR_DATA, m) for m in members)
    body += codec.nested(ipset_messages.ATTR_ADT, adt)
    kind = (ipset_messages.NFNL_SUBSYS_IPSET << 8) | ipset_messages.CMD_LIST
    return codec._NLMSGHDR.pack(16 + len(body), kind, codec.NLM_F_MULTI, 1, 0) + body


def _mac(address: str) -> bytes:
    return codec.attr(17, bytes.fromhex(address.replace(":", "")))  # IPSET_ATTR_ETHER


def _net(address: str, prefix: int) -> bytes:
    ip = codec.nested(
        ipset_messages.DATA_IP,
        codec.attr(
            ipset_messages.IPADDR_IPV4 | ipset_messages.NLA_F_NET_BYTEORDER,
            socket.inet_aton(address),
        ),
    )
    return ip + codec.attr(ipset_messages.DATA_CIDR, bytes([prefix]))


def test_the_fixture_is_what_it_says() -> None:
    assert _names(_captured()) == set(OURS) | FOREIGN


def test_foreign_sets_of_any_type_do_not_stop_reading_ours() -> None:
    ipsets = IPSets(DumpChannel(_captured()))
    assert ipsets.read() == OURS
    assert {name for name, _ in ipsets.each_part()} == set(OURS)


def test_a_foreign_hash_mac_set_and_its_continuation_are_skipped() -> None:
    replies = [
        _reply("foreign-mac", "hash:mac", _mac("00:11:22:33:44:55")),
        _reply("foreign-mac", None, _mac("00:11:22:33:44:66")),  # the set's next message
        *_captured(),
    ]
    assert IPSets(DumpChannel(replies)).read() == OURS


def test_a_set_of_ours_of_an_unknown_type_reads_as_empty() -> None:
    """Someone created KUBE-CLUSTER-IP as hash:net: its members cannot be ours; the set reads
    empty (the dataplane's adds are then refused by the kernel and reported), the rest is read."""
    name = ipset_specs.CLUSTER_IP
    replies = [r for r in _captured() if name not in _names([r])] + [
        _reply(name, "hash:net", _net("10.0.0.0", 8))
    ]
    assert IPSets(DumpChannel(replies)).read() == {**OURS, name: set()}
