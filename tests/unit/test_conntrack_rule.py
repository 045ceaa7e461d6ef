"""Which UDP conntrack entries go: upstream's CleanStaleEntries rule (cleanup.go)."""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence

from ipvsproxy.core.virtual_servers import Protocol, ServiceKey
from ipvsproxy.kernel.conntrack import DEFAULT_BOUNDS, Bounds, Conntrack, Stale, Unfinished, stale
from ipvsproxy.kernel.netlink import codec, ct_messages
from ipvsproxy.kernel.netlink.sock import Outcome

A, B, C = ("10.244.1.11", 53), ("10.244.2.11", 53), ("10.244.3.11", 53)


def test_with_endpoints_every_entry_no_endpoint_answers_goes() -> None:
    live = {A, B}
    assert not stale(A, live, ())
    assert stale(C, live, ())  # an endpoint gone long ago
    assert stale(("10.96.0.10", 53), live, ())  # refused or dropped before: never NATed
    assert stale(C, live, {C})


def test_an_endpoint_is_its_address_and_port_as_upstreams() -> None:
    """Upstream matches the reply's source IP:port against the serving endpoints' IP:port."""
    assert stale(("10.244.1.11", 5353), {A}, ())
    assert not stale(("10.244.1.11", 5353), set(), {A})


def test_without_endpoints_only_the_entries_of_removed_ones_go() -> None:
    assert stale(A, set(), {A})
    assert not stale(B, set(), {A})
    assert not stale(("10.96.0.10", 53), set(), ())  # as upstream: nothing to flush towards


UDP, TCP = socket.IPPROTO_UDP, socket.IPPROTO_TCP
DNS = ServiceKey("10.96.0.10", Protocol.UDP, 53)
OTHER = ServiceKey("10.96.0.11", Protocol.UDP, 53)
DNS6 = ServiceKey("fd00:10:96::a", Protocol.UDP, 53)


def entry(dst: tuple[str, int], reply_src: tuple[str, int], ident: int = 7) -> bytes:
    """One dump reply: a UDP entry from a client to ``dst`` answered by ``reply_src``."""
    fam = socket.AF_INET6 if ":" in dst[0] else socket.AF_INET
    client = ("fd00::99", 40000) if fam == socket.AF_INET6 else ("10.0.0.99", 40000)
    orig = (client[0], client[1], dst[0], dst[1])
    msg = ct_messages.create_request(fam, 0, orig, (*reply_src, *client))
    return msg + codec.attr(ct_messages.CTA_ID, ident.to_bytes(4, "big"))


def framed(raw: bytes) -> codec.Message:
    """``raw`` (a message and attributes appended) as one received message."""
    fixed = len(raw).to_bytes(4, "little") + raw[4:]
    (msg,) = codec.messages(fixed)
    return msg


class Kernel:
    """A netlink socket over a table of entries: a dump answers the entries whose destination
    the request's filter names (as the kernel's CTA_FILTER would), and counts what it sends;
    deletes are recorded, one ``execute`` a batch."""

    def __init__(self, table: list[bytes]) -> None:
        self.table = table
        self.dumps: list[bytes] = []
        self.sent = 0  # entries the dumps yielded
        self.batches: list[list[bytes]] = []
        self.sends = self.receives = self.seq = 0
        self.closed = False

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def dump(self, request: bytes, seq: int) -> Iterator[codec.Message]:
        self.dumps.append(request)
        for raw in self.table:
            msg = framed(raw)
            flow = ct_messages.flow(msg)
            if flow is None or flow.destination[1].to_bytes(2, "big") in request:
                self.sent += 1
                yield msg

    def execute(self, requests: Sequence[tuple[int, bytes]]) -> list[Outcome]:
        self.batches.append([msg for _, msg in requests])
        return [Outcome(seq, 0) for seq, _ in requests]

    def request(self, request: bytes, seq: int) -> list[codec.Message]:
        raise AssertionError("not used")

    def close(self) -> None:
        self.closed = True


def backend(kernel: Kernel, bounds: Bounds = DEFAULT_BOUNDS) -> Conntrack:
    return Conntrack(bounds=bounds, open_socket=lambda: kernel)


def test_each_target_is_one_dump_filtered_in_the_kernel_by_its_address_port_and_udp() -> None:
    kernel = Kernel([])
    backend(kernel).flush_stale({DNS: Stale({A}), DNS6: Stale({A})})
    v4, v6 = kernel.dumps
    assert socket.inet_pton(socket.AF_INET, DNS.address) in v4
    assert b"\x00\x35" in v4 and b"\x00\x35" in v6
    flags = int.from_bytes(v4[-4:], "little")
    assert (
        flags
        == ct_messages.FILTER_IP_DST
        | ct_messages.FILTER_PROTO_NUM
        | ct_messages.FILTER_PROTO_DST_PORT
    )
    # IPv6: the kernel's address match is inverted in 6.1; filtered by protocol and port.
    assert int.from_bytes(v6[-4:], "little") == flags & ~ct_messages.FILTER_IP_DST
    assert socket.inet_pton(socket.AF_INET6, DNS6.address) not in v6


def test_only_the_targets_stale_entries_go_in_one_batch_on_one_socket() -> None:
    stale_ones = [entry((DNS.address, 53), ("10.244.9.9", 53), ident=i) for i in range(3)]
    kept = entry((DNS.address, 53), A)
    other = entry((OTHER.address, 53), ("10.244.9.9", 53))  # same port: the address tells
    v6 = entry((DNS6.address, 53), ("fd00:10:244::9", 53))
    v6_other = entry(("fd00:10:96::b", 53), ("fd00:10:244::9", 53))
    kernel = Kernel([*stale_ones, kept, other, v6, v6_other])
    out = backend(kernel).flush_stale({DNS: Stale({A}), DNS6: Stale({("fd00:10:244::1", 53)})})
    assert out == {DNS: 3, DNS6: 1}
    v4_batch, v6_batch = kernel.batches
    assert [b"\x00\x00\x00" + bytes([i]) in msg for i, msg in enumerate(v4_batch)] == [True] * 3
    assert len(v6_batch) == 1 and socket.inet_pton(socket.AF_INET6, DNS6.address) in v6_batch[0]


def test_a_flush_stops_reading_at_its_bound_of_deletes() -> None:
    """The dump is streamed: at the bound the rest of it is not read, and its socket (with
    the dump's unread replies) is closed; the target is unfinished."""
    table = [entry((DNS.address, 53), ("10.244.9.9", 53), ident=i) for i in range(10)]
    kernel = Kernel(table)
    out = backend(kernel, Bounds(examined=1_000, deleted=4)).flush_stale({DNS: Stale({A})})
    assert out == {DNS: Unfinished(4)}
    assert kernel.sent == 4 and kernel.closed
    assert [len(b) for b in kernel.batches] == [4]


def test_an_entry_without_a_readable_destination_is_skipped_not_fatal() -> None:
    """One odd entry in the table (no reply tuple) costs nothing to the others."""
    fam, client = socket.AF_INET, ("10.0.0.99", 40000, DNS.address, 53)
    odd = ct_messages._message(
        0, 0, fam, 0, codec.nested(1, ct_messages._tuple(fam, *client[::2], UDP, 40000, 53))
    )
    stale_one = entry((DNS.address, 53), ("10.244.9.9", 53))
    kernel = Kernel([odd, stale_one])
    out = backend(kernel).flush_stale({DNS: Stale({A}), OTHER: Stale({A})})
    assert out == {DNS: 1, OTHER: 0}
    assert sum(len(b) for b in kernel.batches) == 1


def test_targets_on_one_port_are_one_dump_filtered_by_the_port() -> None:
    """A NodePort's virtual servers (one per node address) share a port, as DNS Services
    do: one dump filtered in the kernel by UDP and the port, not one per address; each
    address's entries are matched to its own virtual server, another host's stay."""
    node_ips = ("192.168.56.11", "10.1.0.11")
    keys = [ServiceKey(ip, Protocol.UDP, 30053) for ip in node_ips]
    table = [entry((ip, 30053), ("10.244.9.9", 53)) for ip in node_ips]
    table += [entry(("192.168.56.99", 30053), ("10.244.9.9", 53))]  # through the node
    kernel = Kernel(table)
    out = backend(kernel).flush_stale(dict.fromkeys(keys, Stale({A})))
    assert out == dict.fromkeys(keys, 1)
    (dump,) = kernel.dumps
    assert int.from_bytes(dump[-4:], "little") & ct_messages.FILTER_IP_DST == 0
    assert [len(b) for b in kernel.batches] == [2]


def test_a_call_makes_at_most_its_bound_of_dumps() -> None:
    """Each dump walks the kernel's whole table: a call makes at most ``bounds.dumps``; the
    targets of the others are left for the next call."""
    keys = [ServiceKey("10.96.0.10", Protocol.UDP, port) for port in (53, 54, 55)]
    kernel = Kernel([])
    out = backend(kernel, Bounds(dumps=2)).flush_stale(dict.fromkeys(keys, Stale({A})))
    assert out == {keys[0]: 0, keys[1]: 0, keys[2]: Unfinished(0)}
    assert len(kernel.dumps) == 2
