"""IPVS over generic netlink: batched writes, lean dumps."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ipvsproxy.core.diff import DestOp, OpKind, ServiceOp
from ipvsproxy.core.virtual_servers import (
    DestKey,
    ObservedDest,
    Seen,
    ServiceKey,
    Traffic,
    VirtualServer,
)
from ipvsproxy.kernel.errors import ApplyError, Counters, Rejected, settle_batch
from ipvsproxy.kernel.netlink import ipvs_messages
from ipvsproxy.kernel.netlink.sock import NETLINK_GENERIC, Channel, NetlinkSocket, resolve_family


def encode(enc: ipvs_messages.Encoder, seq: int, op: ServiceOp | DestOp) -> bytes:
    """The request for one operation (pure: also what the host benchmark encodes)."""
    if isinstance(op, ServiceOp):
        if op.kind is OpKind.ADD:
            return enc.new_service(seq, op.server)
        if op.kind is OpKind.SET:
            return enc.set_service(seq, op.server)
        return enc.del_service(seq, op.server.key)
    if op.kind is OpKind.ADD:
        return enc.new_dest(seq, op.service, op.server)
    if op.kind is OpKind.SET:
        return enc.set_dest(seq, op.service, op.server)
    return enc.del_dest(seq, op.service, op.server.key)


_ADD_DEST = "add_dest"
_KINDS = {
    (kind, cls): f"{kind}_{name}"
    for kind in OpKind
    for cls, name in ((ServiceOp, "service"), (DestOp, "dest"))
}


class IPVS:
    """The node's IPVS table over generic netlink: virtual servers and their real servers read
    back (with their counters for ``ipvsproxy status``), and operations written.

    Owns its netlink socket and ``counters`` (writes by kind and outcome); holds no copy of
    the table. ``apply`` writes the operations in order, in batches, and returns how many it
    applied. Operations the kernel refuses raise one ApplyError naming each of them (its
    ``failed``: their positions) once every other operation of the call has been applied.
    Which virtual servers are ipvsproxy's is the caller's decision: this writes what it is
    given and nothing else."""

    def __init__(self, sock: Channel | None = None, family_id: int | None = None) -> None:
        """``sock`` and ``family_id`` stand in for the kernel's (the host benchmark's)."""
        self.sock: Channel = sock or NetlinkSocket(NETLINK_GENERIC)
        if family_id is None:
            family_id = resolve_family(self.sock, ipvs_messages.GENL_NAME)
        self.encoder = ipvs_messages.Encoder(family_id)
        self.counters = Counters()

    def close(self) -> None:
        self.sock.close()

    def services(self) -> dict[ServiceKey, VirtualServer]:
        return {vs.key: vs for vs in self.each_service()}

    def each_service(self) -> Iterator[VirtualServer]:
        """The virtual servers as they are read (a full sync keeps few of these objects)."""
        seq = self.sock.next_seq()
        for msg in self.sock.dump(self.encoder.dump_services(seq), seq):
            vs = ipvs_messages.parse_service(msg)
            if vs is not None:
                yield vs

    def dests(self, key: ServiceKey) -> dict[DestKey, Seen]:
        seq = self.sock.next_seq()
        family = ipvs_messages.family_of(key)
        found: dict[DestKey, Seen] = {}
        for msg in self.sock.dump(self.encoder.dump_dests(seq, key), seq):
            dest = ipvs_messages.parse_dest(msg, family)
            if dest is not None:
                found[dest.server.key] = dest
        return found

    def services_with_traffic(self) -> dict[ServiceKey, tuple[VirtualServer, Traffic]]:
        """Virtual servers with their counters: the operator's view, not the sync path's."""
        seq = self.sock.next_seq()
        found: dict[ServiceKey, tuple[VirtualServer, Traffic]] = {}
        for msg in self.sock.dump(self.encoder.dump_services(seq), seq):
            vs = ipvs_messages.parse_service(msg)
            if vs is not None:
                found[vs.key] = (vs, ipvs_messages.service_traffic(msg))
        return found

    def dests_with_traffic(self, key: ServiceKey) -> dict[DestKey, tuple[ObservedDest, Traffic]]:
        seq = self.sock.next_seq()
        family = ipvs_messages.family_of(key)
        found: dict[DestKey, tuple[ObservedDest, Traffic]] = {}
        for msg in self.sock.dump(self.encoder.dump_dests(seq, key), seq):
            dest = ipvs_messages.parse_dest(msg, family)
            if dest is not None:
                found[dest.server.key] = (dest, ipvs_messages.dest_traffic(msg))
        return found

    def apply(self, ops: Sequence[ServiceOp | DestOp]) -> int:
        """Apply in order, batched; raise ApplyError naming every rejected operation."""
        if not ops:
            return 0
        enc, next_seq = self.encoder, self.sock.next_seq
        requests: list[tuple[int, bytes]] = []
        kinds: list[str] = []
        request, kind, new_dest = requests.append, kinds.append, enc.new_dest
        add = OpKind.ADD
        for op in ops:
            seq = next_seq()
            if op.kind is add and type(op) is DestOp:  # most of a cold sync: directly
                request((seq, new_dest(seq, op.service, op.server)))
                kind(_ADD_DEST)
            else:
                request((seq, encode(enc, seq, op)))
                kind(_KINDS[op.kind, type(op)])
        outcomes = self.sock.execute(requests)
        return settle_batch(
            kinds, [o.errno for o in outcomes], lambda i: str(ops[i]), self.counters
        )

    def read_timeouts(self) -> tuple[int, int, int]:
        """``ipvsadm -L --timeout``: (tcp, tcpfin, udp) in seconds."""
        seq = self.sock.next_seq()
        (reply, *_) = self.sock.request(self.encoder.get_config(seq), seq)
        return ipvs_messages.parse_config(reply)

    def set_timeouts(self, tcp: int, tcp_fin: int, udp: int) -> None:
        seq = self.sock.next_seq()
        (outcome,) = self.sock.execute([(seq, self.encoder.set_config(seq, tcp, tcp_fin, udp))])
        self.counters.count("set_config", outcome.ok)
        if not outcome.ok:
            raise ApplyError([Rejected("set IPVS timeouts", outcome.errno)], 0)
