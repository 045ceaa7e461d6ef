"""ipsets over netlink: members added, removed and dumped with our own lean messages, in
batches; sets created the same way (each type at the newest revision the kernel has) and
destroyed by pyroute2 (only ``ipvsproxy cleanup`` does).

Members change with every endpoint change, so they go as batched nfnetlink requests (pyroute2's
IPSet sends one request per entry and waits for each ack), each with its own ack: a refused
member is named and the rest of the batch applies. A full reconcile reads every member back in
one dump, decoded here rather than by pyroute2's far slower codec (docs/performance.md).
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

from ipvsproxy.core import ipset_specs
from ipvsproxy.core.diff import MemberOp, OpKind
from ipvsproxy.kernel.errors import Counters, Result, settle, settle_batch
from ipvsproxy.kernel.netlink import ipset_messages
from ipvsproxy.kernel.netlink.sock import (
    NETLINK_NETFILTER,
    Channel,
    NetlinkError,
    NetlinkSocket,
)

_FAMILIES = {4: socket.AF_INET, 6: socket.AF_INET6}


def encode(seq: int, op: MemberOp) -> bytes:
    """The request for one operation (pure: also what the host benchmark encodes)."""
    set_type = ipset_specs.BY_NAME[op.set_name].type
    return ipset_messages.member_message(
        seq, op.kind is OpKind.ADD, op.set_name, set_type, op.entry
    )


_KINDS = {kind: f"{kind}_member" for kind in OpKind}


class IPSets:
    """The ipsets named in ``ipvsproxy.core.ipset_specs``, over nfnetlink: their members read
    back, missing sets created, members added and deleted.

    Owns its netlink socket and ``counters``; holds no copy of the sets. A set of any other
    name is never read, written nor destroyed. ``apply`` writes the member operations in
    order, in batches, and returns how many it applied; ``ensure`` returns how many sets it
    created. Operations the kernel refuses raise one ApplyError naming each of them with
    ipset's reason, once every other operation of the call has been applied."""

    def __init__(self, sock: Channel | None = None) -> None:
        self.counters = Counters()
        self.sock: Channel = sock or NetlinkSocket(NETLINK_NETFILTER)

    def close(self) -> None:
        self.sock.close()

    def read(self) -> dict[str, set[str]]:
        """Members of every ipvsproxy-named set that exists (others are not ours to read)."""
        sets: dict[str, set[str]] = {}
        for name, members in self.each_part():
            sets.setdefault(name, set()).update(members)
        return sets

    def each_part(self) -> Iterator[tuple[str, list[str]]]:
        """``read`` as the dump comes: (set name, entries) per message, a set's in a row, and
        at least one for every set of ours that exists."""
        seq = self.sock.next_seq()
        types = {name: spec.type for name, spec in ipset_specs.BY_NAME.items()}
        for msg in self.sock.dump(ipset_messages.list_request(seq), seq):
            parsed = ipset_messages.parse_list(msg, types, ipset_specs.NAMES)
            if parsed is None:
                continue
            name, set_type, members = parsed
            types[name] = set_type
            yield name, members

    def ensure(self, existing: Collection[str], names: Iterable[str] = ipset_specs.NAMES) -> int:
        """Create the sets that are missing; returns how many were created."""
        missing = [ipset_specs.BY_NAME[n] for n in sorted(names) if n not in existing]
        if not missing:
            return 0
        revisions: dict[str, int] = {}
        requests = []
        for spec in missing:
            if spec.type not in revisions:
                revisions[spec.type] = self._newest_revision(spec.type)
            seq = self.sock.next_seq()
            requests.append(
                (
                    seq,
                    ipset_messages.create_request(
                        seq, spec.name, spec.type, revisions[spec.type], _FAMILIES[spec.family]
                    ),
                )
            )
        outcomes = self.sock.execute(requests)

        def describe(i: int) -> str:
            why = ipset_messages.ERRORS.get(outcomes[i].errno) or os.strerror(outcomes[i].errno)
            return f"create ipset {missing[i].name}: {why}"

        settle_batch(["set"] * len(missing), [o.errno for o in outcomes], describe, self.counters)
        return len(missing)

    def _newest_revision(self, set_type: str) -> int:
        seq = self.sock.next_seq()
        try:
            (reply,) = self.sock.request(ipset_messages.type_request(seq, set_type), seq)
        except NetlinkError as exc:
            code = exc.errno or errno.EINVAL
            why = ipset_messages.ERRORS.get(code) or exc.strerror
            settle([Result("set", f"ipset type {set_type}: {why}", code)], self.counters)
            raise  # settle raised for the failure already
        return ipset_messages.newest_revision(reply)

    def apply(self, ops: Sequence[MemberOp]) -> int:
        if not ops:
            return 0
        requests = []
        for op in ops:
            seq = self.sock.next_seq()
            requests.append((seq, encode(seq, op)))
        outcomes = self.sock.execute(requests)
        kinds = [_KINDS[op.kind] for op in ops]

        def describe(i: int) -> str:
            return f"{ops[i]}: {ipset_messages.ERRORS.get(outcomes[i].errno, outcomes[i].message)}"

        return settle_batch(kinds, [o.errno for o in outcomes], describe, self.counters)

    def destroy(self, names: Iterable[str]) -> None:
        """Flush and destroy sets with our names (never anyone else's)."""
        ours = sorted(n for n in names if n in ipset_specs.NAMES)

        def remove(name: str) -> Callable[[Any], None]:
            def run(ips: Any) -> None:
                ips.flush(name)
                ips.destroy(name)

            return run

        self._each([f"destroy ipset {n}" for n in ours], [remove(n) for n in ours])

    def _each(self, what: list[str], actions: list[Callable[[Any], object]]) -> None:
        """Set operations only ``ipvsproxy cleanup`` makes, through pyroute2's IPSet."""
        if not actions:
            return
        from pyroute2 import IPSet as PyIPSet  # imported when first needed: it is slow

        results = []
        with PyIPSet() as ips:
            for label, action in zip(what, actions, strict=True):
                try:
                    action(ips)
                    results.append(Result("set", label, 0))
                except Exception as exc:  # pyroute2's NetlinkError carries the errno as code
                    code = int(getattr(exc, "code", 0) or errno.EINVAL)
                    results.append(Result("set", f"{label}: {exc}", code))
        settle(results, self.counters)
