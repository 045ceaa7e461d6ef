"""The real netlink backends over the fakes' tables: their codec, batching and counting, with
the fakes' kernel behind them.

A ``FakeChannel`` takes the place of the netlink socket: it sends nothing and answers each
request of a batch with the errno the fake gives the batch's operation at the same position
(``FakeIPVS.outcome``: the operation applied to its table, or refused). So every write is
encoded by the real backend's codec, as for the kernel (an encoding that fails raises as it
would on a node), and counted by the real backend, in the fake's ``Counters``; reads, and the
writes that do not go over the channel (creating the device, the sets), are the fake's.

For tests that must cover the codec (odd inputs through the whole dataplane) and for the host
benchmark, which measures what encoding costs; the fakes alone serve every other test.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.diff import AddressOp, DestOp, MemberOp, ServiceOp
from ipvsproxy.core.virtual_servers import (
    DestKey,
    ObservedDest,
    Seen,
    ServiceKey,
    Traffic,
    VirtualServer,
)
from ipvsproxy.kernel.addresses import Addresses
from ipvsproxy.kernel.backends import Backends
from ipvsproxy.kernel.fakes import (
    FakeAddresses,
    FakeConntrack,
    FakeIPSets,
    FakeIPTables,
    FakeIPVS,
    FakeSysctls,
    wire,
)
from ipvsproxy.kernel.ipset import IPSets
from ipvsproxy.kernel.ipvs import IPVS
from ipvsproxy.kernel.netlink import codec
from ipvsproxy.kernel.netlink.sock import Outcome

IPVS_FAMILY_ID = 0x1C  # any generic netlink family id: nothing is sent


def _unexpected(i: int) -> int:
    raise AssertionError("a request outside a fake's apply")


class FakeChannel:
    """A netlink channel that sends nothing: the i-th request of a batch is answered by
    ``answer(i)``; counts what would have been sent."""

    def __init__(self) -> None:
        self.seq = 0
        self.sends = 0
        self.receives = 0
        self.requests = 0
        self.bytes = 0
        self.answer: Callable[[int], int] = _unexpected

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def count(self, requests: Sequence[tuple[int, bytes]]) -> None:
        self.sends += 1
        self.receives += 1
        self.requests += len(requests)
        self.bytes += sum(len(msg) for _, msg in requests)

    def execute(self, requests: Sequence[tuple[int, bytes]]) -> list[Outcome]:
        self.count(requests)
        answer = self.answer
        return [Outcome(seq, answer(i)) for i, (seq, _) in enumerate(requests)]

    def dump(self, request: bytes, seq: int) -> Iterator[codec.Message]:
        raise AssertionError("a fake's reads are its tables, never dumped")

    def request(self, request: bytes, seq: int) -> list[codec.Message]:
        raise AssertionError("a fake's reads are its tables, never requested")

    def close(self) -> None:
        pass


class CodecIPVS(IPVS):
    """The real IPVS backend, its batch answered by ``fake``."""

    def __init__(self, fake: FakeIPVS | None = None, channel: FakeChannel | None = None) -> None:
        self.fake = fake or FakeIPVS()
        self.channel = channel or FakeChannel()
        super().__init__(self.channel, IPVS_FAMILY_ID)
        self.counters = self.fake.counters

    def apply(self, ops: Sequence[ServiceOp | DestOp]) -> int:
        self.fake.on_call("apply", ops)
        outcome = self.fake.outcome
        self.channel.answer = lambda i: outcome(ops[i])
        try:
            return super().apply(ops)
        finally:
            self.channel.answer = _unexpected

    def each_service(self) -> Iterator[VirtualServer]:
        return self.fake.each_service()

    def services(self) -> dict[ServiceKey, VirtualServer]:
        return self.fake.services()

    def dests(self, key: ServiceKey) -> dict[DestKey, Seen]:
        return self.fake.dests(key)

    def services_with_traffic(self) -> dict[ServiceKey, tuple[VirtualServer, Traffic]]:
        return self.fake.services_with_traffic()

    def dests_with_traffic(self, key: ServiceKey) -> dict[DestKey, tuple[ObservedDest, Traffic]]:
        return self.fake.dests_with_traffic(key)

    def read_timeouts(self) -> tuple[int, int, int]:
        return self.fake.read_timeouts()

    def set_timeouts(self, tcp: int, tcp_fin: int, udp: int) -> None:
        self.fake.set_timeouts(tcp, tcp_fin, udp)


class CodecIPSets(IPSets):
    """The real ipset backend, its member batches answered by ``fake``; sets are created and
    destroyed by the fake (over pyroute2 and a type request on a node)."""

    def __init__(self, fake: FakeIPSets | None = None, channel: FakeChannel | None = None) -> None:
        self.fake = fake or FakeIPSets()
        self.channel = channel or FakeChannel()
        super().__init__(self.channel)
        self.counters = self.fake.counters

    def apply(self, ops: Sequence[MemberOp]) -> int:
        self.fake.on_call("apply", ops)
        outcome = self.fake.outcome
        self.channel.answer = lambda i: outcome(ops[i])
        try:
            return super().apply(ops)
        finally:
            self.channel.answer = _unexpected

    def read(self) -> dict[str, set[str]]:
        return self.fake.read()

    def each_part(self) -> Iterator[tuple[str, list[str]]]:
        return self.fake.each_part()

    def ensure(self, existing: Collection[str], names: Iterable[str] = ipset_specs.NAMES) -> int:
        return self.fake.ensure(existing, names)

    def destroy(self, names: Iterable[str]) -> None:
        self.fake.destroy(names)


class CodecAddresses(Addresses):
    """The real address backend, its batches answered by ``fake``; the devices are the
    fake's."""

    def __init__(
        self, fake: FakeAddresses | None = None, channel: FakeChannel | None = None
    ) -> None:
        self.fake = fake or FakeAddresses()
        self.channel = channel or FakeChannel()
        super().__init__(self.fake.device, self.channel)
        self.counters = self.fake.counters

    def apply(self, ops: Sequence[AddressOp]) -> int:
        self.fake.on_call("apply", ops)
        outcome = self.fake.outcome
        self.channel.answer = lambda i: outcome(ops[i])
        try:
            return super().apply(ops)
        finally:
            self.channel.answer = _unexpected

    def ensure_device(self) -> int:
        return self.fake.ensure_device()

    def remove_device(self) -> None:
        self.fake.remove_device()

    def device_index(self) -> int | None:
        return self.fake.device_index()

    def indexed(self) -> list[tuple[int, str]]:
        return self.fake.indexed()

    def bound(self) -> set[str]:
        return self.fake.bound()


@dataclass
class CodecBackends(Backends):
    """``Backends`` whose netlink ones encode for the fakes (``ipvs.fake`` holds the table);
    iptables, conntrack and sysctls are the fakes themselves."""

    ipvs: CodecIPVS
    addresses: CodecAddresses
    ipsets: CodecIPSets
    iptables: FakeIPTables
    conntrack: FakeConntrack
    sysctls: FakeSysctls


def codec_backends() -> CodecBackends:
    """A fresh node's kernel (as ``fakes.fake_backends()``) behind the real codec."""
    ipsets, iptables = FakeIPSets(), FakeIPTables()
    wire(ipsets, iptables)
    return CodecBackends(
        CodecIPVS(),
        CodecAddresses(),
        CodecIPSets(ipsets),
        iptables,
        FakeConntrack(),
        FakeSysctls(),
    )
