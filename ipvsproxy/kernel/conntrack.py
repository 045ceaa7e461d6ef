"""Stale UDP conntrack entries, over ctnetlink (our own messages: netlink/ct_messages.py).

Upstream's CleanStaleEntries (pkg/proxy/conntrack/cleanup.go): a UDP flow's conntrack entry
outlives the real server that answered it, and one created while the Service had no endpoint
(refused by the node, dropped) skips the nat rules for good: clients stay blackholed until it
expires, which a client sending more often never lets happen. So the entries to a UDP virtual
server that none of its real servers answers are deleted. As upstream, an entry is matched by
its original destination's address and port, and a real server is its address and port.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from ipvsproxy.core.virtual_servers import ServiceKey
from ipvsproxy.kernel.errors import Counters
from ipvsproxy.kernel.netlink import ct_messages
from ipvsproxy.kernel.netlink.ct_messages import Flow
from ipvsproxy.kernel.netlink.sock import NETLINK_NETFILTER, Channel, NetlinkSocket

Endpoint = tuple[str, int]  # a real server's (address, port); a DestKey is one


class Stale(NamedTuple):
    """What makes an entry to one UDP virtual server stale: its real servers (``live``) and
    those a sync removed (``gone``), each (address, port)."""

    live: Collection[Endpoint]
    gone: Collection[Endpoint] = ()


class Unfinished(NamedTuple):
    """A target's outcome when the call's bounds stopped it: ``deleted`` entries went, and
    some may be left for the next call."""

    deleted: int


class Bounds(NamedTuple):
    """The work of one ``flush_stale`` call (it runs under the sync lock): once ``examined``
    entries were read or ``dumps`` dumps made (each walks the kernel's whole table), the
    targets not begun are left; at ``deleted`` deletions, all stop."""

    examined: int = 100_000
    deleted: int = 10_000
    dumps: int = 200


DEFAULT_BOUNDS = Bounds()


def stale(answered_by: Endpoint, live: Collection[Endpoint], gone: Collection[Endpoint]) -> bool:
    """Whether an entry to a UDP virtual server answered by ``answered_by`` goes.

    With real servers (``live``), every entry none of them answers goes, as upstream. Without,
    upstream keeps every entry; here those answered by the real servers just removed
    (``gone``) go: they answer no more.
    """
    return answered_by not in live if live else answered_by in gone


def family(address: str) -> int:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


@dataclass
class Budget:
    """What one call has spent of its ``bounds``."""

    bounds: Bounds
    examined: int = 0
    deleted: int = 0
    dumps: int = 0

    def may_begin(self) -> bool:
        b = self.bounds
        return self.examined < b.examined and self.deleted < b.deleted and self.dumps < b.dumps


Group = dict[Endpoint, tuple[ServiceKey, Stale]]  # targets by destination (address, port)


def sweep(
    flows: Iterable[Flow | None], group: Group, budget: Budget
) -> tuple[list[tuple[ServiceKey, Flow]], bool]:
    """The stale entries (UDP, to a target's address and port) among ``flows``, read one at a
    time, each with its target; stops when ``budget``'s deletions are spent. Returns them, and
    whether ``flows`` was read to its end. An entry without addresses (None) is skipped."""
    doomed: list[tuple[ServiceKey, Flow]] = []
    udp = socket.IPPROTO_UDP
    for flow in flows:
        budget.examined += 1
        if flow is None or flow.protocol != udp:
            continue
        hit = group.get(flow.destination)
        if hit is None:
            continue
        key, why = hit
        if stale(flow.answered_by, why.live, why.gone):
            doomed.append((key, flow))
            budget.deleted += 1
            if budget.deleted >= budget.bounds.deleted:
                return doomed, False
    return doomed, True


def spelled(address: str) -> str:
    """``address`` as the kernel's are read (inet_ntop); OSError for no address."""
    fam = family(address)
    return socket.inet_ntop(fam, socket.inet_pton(fam, address))


def canonical(why: Stale) -> Stale:
    """``why`` with its addresses spelled as the kernel's are read."""
    return Stale({(spelled(a), p) for a, p in why.live}, {(spelled(a), p) for a, p in why.gone})


def groups(
    targets: Mapping[ServiceKey, Stale],
) -> tuple[dict[tuple[int, int], Group], dict[ServiceKey, Exception]]:
    """The targets by (address family, port), each group one dump (a NodePort's virtual
    servers, one per node address, share theirs); and the targets whose addresses are none."""
    out: dict[tuple[int, int], Group] = {}
    bad: dict[ServiceKey, Exception] = {}
    for key in sorted(targets):
        try:
            to = (spelled(key.address), key.port)
            why = canonical(targets[key])
        except (OSError, ValueError) as exc:
            bad[key] = exc
            continue
        out.setdefault((family(key.address), key.port), {})[to] = (key, why)
    return out, bad


class Conntrack:
    """Deletes stale UDP conntrack entries (see ``stale``) over one ctnetlink socket, opened
    at first use and kept until ``close`` (or until a dump is left unread: its replies go with
    it).

    Owns that socket and ``counters``; holds no table. The targets of one address family and
    port are one dump filtered in the kernel (ct_messages.dump_request: by UDP and the port,
    and by the address for one IPv4 target), decoded one entry at a time as it arrives; the
    stale entries are then deleted in batches (each request names the entry's id: one that
    changed meanwhile is not touched). A call's work is bounded by ``bounds``, a group at a
    time; ``examined`` counts every entry Python received. A delete that fails (an entry gone
    meanwhile) is counted as failed and skipped; a dump the kernel refuses fails its group."""

    def __init__(
        self, bounds: Bounds = DEFAULT_BOUNDS, open_socket: Callable[[], Channel] | None = None
    ) -> None:
        self.counters = Counters()
        self.bounds = bounds
        self.examined = 0
        self._open = open_socket or (lambda: NetlinkSocket(NETLINK_NETFILTER))
        self._sock: Channel | None = None

    def _socket(self) -> Channel:
        if self._sock is None:
            self._sock = self._open()
        return self._sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def flush_stale(
        self, targets: Mapping[ServiceKey, Stale]
    ) -> dict[ServiceKey, int | Unfinished | Exception]:
        """Delete the UDP entries to each of ``targets`` that are ``stale``; returns how many
        went for each, Unfinished for those the bounds stopped or left, or the error that
        failed it."""
        budget = Budget(self.bounds)
        by_port, bad = groups(targets)
        outcomes: dict[ServiceKey, int | Unfinished | Exception] = dict(bad)
        for (fam, port), group in by_port.items():
            keys = [key for key, _ in group.values()]
            if not budget.may_begin():
                outcomes.update(dict.fromkeys(keys, Unfinished(0)))
                continue
            try:
                outcomes.update(self._flush(fam, port, group, budget))
            except Exception as exc:  # the dump: NetlinkError
                self.close()
                outcomes.update(dict.fromkeys(keys, exc))
        return outcomes

    def _flush(
        self, fam: int, port: int, group: Group, budget: Budget
    ) -> dict[ServiceKey, int | Unfinished]:
        sock = self._socket()
        seq = sock.next_seq()
        budget.dumps += 1
        (only, _), *more = group
        address = only if not more else None
        request = ct_messages.dump_request(fam, seq, address, port, socket.IPPROTO_UDP)
        before = budget.examined
        flows = (ct_messages.flow(msg) for msg in sock.dump(request, seq))
        try:
            doomed, finished = sweep(flows, group, budget)
        finally:
            self.examined += budget.examined - before
        if not finished:
            self.close()  # the dump's unread replies go with its socket
        deleted = self._delete(fam, doomed)
        return {
            key: deleted.get(key, 0) if finished else Unfinished(deleted.get(key, 0))
            for key, _ in group.values()
        }

    def _delete(self, fam: int, doomed: list[tuple[ServiceKey, Flow]]) -> dict[ServiceKey, int]:
        """Delete ``doomed`` in batches; how many went of each target."""
        deleted: dict[ServiceKey, int] = {}
        if not doomed:
            return deleted
        sock = self._socket()
        requests = []
        for _, flow in doomed:
            seq = sock.next_seq()
            requests.append((seq, ct_messages.delete_request(fam, seq, flow)))
        outcomes = sock.execute(requests)  # refused: ENOENT, gone or changed meanwhile
        for (key, _), outcome in zip(doomed, outcomes, strict=True):
            self.counters.count("delete_conntrack", outcome.ok)
            deleted[key] = deleted.get(key, 0) + outcome.ok
        return deleted
