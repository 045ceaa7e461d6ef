"""The dummy device kube-ipvs0 and the service addresses bound to it; the node's addresses."""

from __future__ import annotations

import errno
import os
import select
import socket
from collections.abc import Sequence

from ipvsproxy.core.diff import AddressOp, OpKind
from ipvsproxy.kernel.errors import Counters, settle_batch
from ipvsproxy.kernel.netlink import codec, rtnl_messages
from ipvsproxy.kernel.netlink.sock import NETLINK_ROUTE, Channel, NetlinkSocket

DUMMY_DEVICE = "kube-ipvs0"


def encode(seq: int, ifindex: int, op: AddressOp) -> bytes:
    """The request for one operation (pure: also what the host benchmark encodes)."""
    build = rtnl_messages.add_address if op.kind is OpKind.ADD else rtnl_messages.del_address
    return build(seq, ifindex, op.address)


class Addresses:
    """The dummy device (``device``, kube-ipvs0) and the addresses bound to it, over
    rtnetlink; also reads every address of the node.

    Owns its netlink socket and ``counters``; holds no copy of the addresses. ``apply``
    creates the device if it is missing, then binds and unbinds in order, in batches, and
    returns how many operations it applied; operations the kernel refuses raise one ApplyError
    naming each of them, once every other operation of the call has been applied. Only the
    device is written: other interfaces are read, never changed."""

    def __init__(self, device: str = DUMMY_DEVICE, sock: Channel | None = None) -> None:
        self.device = device
        self.sock: Channel = sock or NetlinkSocket(NETLINK_ROUTE)
        self.counters = Counters()

    def close(self) -> None:
        self.sock.close()

    def ensure_device(self) -> int:
        """Create the dummy device if missing (down, as upstream keeps it); return its index."""
        try:
            return socket.if_nametoindex(self.device)
        except OSError:
            pass
        # Over the socket the addresses use, not pyroute2: once imported, it would stay in the
        # daemon's memory for good.
        seq = self.sock.next_seq()
        (outcome,) = self.sock.execute([(seq, rtnl_messages.new_link(seq, self.device, "dummy"))])
        if outcome.errno not in (0, errno.EEXIST):
            self.counters.count("add_device", False)
            raise OSError(outcome.errno, f"creating {self.device}: {os.strerror(outcome.errno)}")
        self.counters.count("add_device", True)
        return socket.if_nametoindex(self.device)

    def remove_device(self) -> None:
        if self.device_index() is None:
            return
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            ipr.link("del", ifname=self.device)
        self.counters.count("delete_device", True)

    def device_index(self) -> int | None:
        try:
            return socket.if_nametoindex(self.device)
        except OSError:
            return None

    def all_addresses(self) -> list[rtnl_messages.InterfaceAddress]:
        seq = self.sock.next_seq()
        found = []
        for msg in self.sock.dump(rtnl_messages.dump_addresses(seq), seq):
            addr = rtnl_messages.parse_address(msg)
            if addr is not None:
                found.append(addr)
        return found

    def indexed(self) -> list[tuple[int, str]]:
        """(interface index, address) for every address on the node."""
        return [(a.ifindex, a.address) for a in self.all_addresses()]

    def bound(self) -> set[str]:
        """Addresses on the dummy device."""
        index = self.device_index()
        if index is None:
            return set()
        return {a.address for a in self.all_addresses() if a.ifindex == index}

    def apply(self, ops: Sequence[AddressOp]) -> int:
        if not ops:
            return 0
        index = self.ensure_device()
        requests = []
        for op in ops:
            seq = self.sock.next_seq()
            requests.append((seq, encode(seq, index, op)))
        outcomes = self.sock.execute(requests)
        return settle_batch(
            [f"{op.kind}_address" for op in ops],
            [o.errno for o in outcomes],
            lambda i: f"{ops[i]} on {self.device}",
            self.counters,
        )


class AddressEvents:
    """The kernel's notices of addresses added to or removed from any interface (DHCP,
    keepalived, kube-vip, ipvsproxy's own binds to kube-ipvs0)."""

    def __init__(self, ipv6: bool = False) -> None:
        """``ipv6``: IPv6 addresses' notices too."""
        self.ipv6 = ipv6
        self.sock = self._open()

    def _open(self) -> socket.socket:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        groups = rtnl_messages.RTMGRP_IPV4_IFADDR
        if self.ipv6:
            groups |= rtnl_messages.RTMGRP_IPV6_IFADDR
        try:
            sock.bind((0, groups))
        except OSError:
            sock.close()
            raise
        return sock

    def reopen(self) -> None:
        """A new socket in place of one that failed (the notices in between are lost)."""
        sock = self._open()
        self.sock.close()
        self.sock = sock

    def close(self) -> None:
        self.sock.close()

    def wait(self, timeout: float) -> set[int] | None:
        """The interfaces whose addresses changed (empty when none within ``timeout``); None
        when notices were lost (the socket's buffer overflowed): any may have changed."""
        # poll, not select: the descriptor may be past 1,023 (the raised open files limit).
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        if not poller.poll(timeout * 1000):
            return set()
        try:
            data = self.sock.recv(1 << 16)
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:
                return None
            raise
        found = (rtnl_messages.address_event_ifindex(msg) for msg in codec.messages(data))
        return {i for i in found if i is not None}
