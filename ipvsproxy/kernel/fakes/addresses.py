"""A fake of the node's network devices and their addresses, kube-ipvs0 among them."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from dataclasses import dataclass, field

from ipvsproxy.core.diff import AddressOp, OpKind
from ipvsproxy.kernel.addresses import DUMMY_DEVICE
from ipvsproxy.kernel.errors import settle_batch
from ipvsproxy.kernel.fakes.faults import FakeBackend


@dataclass
class Device:
    index: int
    addresses: set[str] = field(default_factory=set)


class FakeAddresses(FakeBackend[AddressOp]):
    """Network devices by name with their IPv4 addresses (the kernel lists IPv6 ones too, which
    the dataplane leaves aside): the loopback device at first, kube-ipvs0 once an address is
    bound (or seeded)."""

    def __init__(self, device: str = DUMMY_DEVICE) -> None:
        super().__init__()
        self.device = device
        self.devices: dict[str, Device] = {"lo": Device(1, {"127.0.0.1"})}

    def add_device(self, name: str, *addresses: str) -> int:
        """Create a device (if missing) with ``addresses`` on it, counting no write; its
        index."""
        index = max(d.index for d in self.devices.values()) + 1
        dev = self.devices.setdefault(name, Device(index))
        dev.addresses.update(addresses)
        return dev.index

    def bound(self) -> set[str]:
        self.on_call("bound")
        dev = self.devices.get(self.device)
        return set(dev.addresses) if dev is not None else set()

    def indexed(self) -> list[tuple[int, str]]:
        self.on_call("indexed")
        return [(d.index, a) for d in self.devices.values() for a in sorted(d.addresses)]

    def device_index(self) -> int | None:
        self.on_call("device_index")
        dev = self.devices.get(self.device)
        return dev.index if dev is not None else None

    def ensure_device(self) -> int:
        self.on_call("ensure_device")
        if self.device not in self.devices:
            self.add_device(self.device)
            self.counters.count("add_device", True)
        return self.devices[self.device].index

    def apply(self, ops: Sequence[AddressOp]) -> int:
        self.on_call("apply", ops)
        if not ops:
            return 0
        self.ensure_device()
        errnos = [self.outcome(op) for op in ops]
        return settle_batch(
            [f"{op.kind}_address" for op in ops],
            errnos,
            lambda i: f"{ops[i]} on {self.device}",
            self.counters,
        )

    def outcome(self, op: AddressOp) -> int:
        """Apply one operation to kube-ipvs0 as the kernel would; its errno (0: applied)."""
        refused = self._refused(op)
        if refused:
            return refused
        bound = self.devices[self.device].addresses
        if op.kind is OpKind.ADD:
            if op.address in bound:
                return errno.EEXIST
            bound.add(op.address)
            return 0
        if op.address not in bound:
            return errno.EADDRNOTAVAIL
        bound.discard(op.address)
        return 0

    def remove_device(self) -> None:
        self.on_call("remove_device")
        if self.devices.pop(self.device, None) is not None:
            self.counters.count("delete_device", True)

    def close(self) -> None:
        self.on_call("close")
