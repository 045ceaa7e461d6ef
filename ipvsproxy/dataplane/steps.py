"""The converge steps that write: addresses on kube-ipvs0, virtual and real servers, ipset
members, iptables rules.

Each step converges the keys it is given, against the observed cache: it applies their
operations in chunks (``batching``), folds what the kernel accepted into the cache, and fails
only the Services whose operations the kernel refused or that raised (``Blame``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from ipvsproxy.core.desired import DesiredState
from ipvsproxy.core.diff import AddressOp, DestOp, MemberOp, OpKind, ServiceOp
from ipvsproxy.core.ruleset import Jump
from ipvsproxy.core.virtual_servers import SERVICE_ORDER, DestKey, Seen, ServiceKey
from ipvsproxy.dataplane.batching import (
    CHUNK_MEMBERS,
    CHUNK_VIRTUAL_SERVERS,
    apply_and_record,
    apply_chunks,
    chunked,
    isolating,
    refusal,
)
from ipvsproxy.dataplane.blame import Blame
from ipvsproxy.dataplane.differ import address_ops, member_ops, service_ops
from ipvsproxy.dataplane.observed import Observed, Problem
from ipvsproxy.dataplane.statefile import State
from ipvsproxy.kernel.errors import ApplyError

if TYPE_CHECKING:
    from ipvsproxy.dataplane.dataplane import Backends


def bind_addresses(
    addresses: set[str],
    desired: DesiredState,
    obs: Observed,
    backends: Backends,
    owned: Callable[[str], bool],
    blame: Blame,
) -> None:
    """Bind the changed ``addresses`` the Services want to kube-ipvs0 (before their virtual
    servers are programmed)."""
    ops = address_ops(desired, addresses, obs.bound, owned)
    ops = [op for op in ops if op.kind is OpKind.ADD]
    bound = obs.bound
    _addresses(ops, lambda done: bound.update(op.address for op in done), backends, blame)


def unbind_addresses(
    addresses: set[str],
    desired: DesiredState,
    obs: Observed,
    backends: Backends,
    owned: Callable[[str], bool],
    blame: Blame,
) -> None:
    """Unbind the changed ``addresses`` of ours no Service wants (after their virtual servers
    are gone)."""
    ops = address_ops(desired, addresses, obs.bound, owned)
    ops = [op for op in ops if op.kind is OpKind.DELETE]
    bound = obs.bound
    _addresses(ops, lambda done: bound.difference_update(o.address for o in done), backends, blame)


def _addresses(
    ops: list[AddressOp],
    record: Callable[[list[AddressOp]], None],
    backends: Backends,
    blame: Blame,
) -> None:
    def apply(chunk: list[AddressOp]) -> int:
        try:
            apply_and_record(backends.addresses.apply, chunk, record)
        except ApplyError as exc:
            for i in exc.failed:
                blame.address(chunk[i], refusal(exc, chunk, i))
            raise
        return len(chunk)

    apply_chunks([ops] if ops else [], isolating(apply, blame.address))


def converge_virtual_servers(
    keys: set[ServiceKey],
    desired: DesiredState,
    obs: Observed,
    state: State,
    backends: Backends,
    *,
    owned: Callable[[ServiceKey], bool],
    expired: Callable[[ServiceKey, Mapping[DestKey, Seen]], set[DestKey]],
    record: Callable[[list[ServiceOp | DestOp]], None],
    blame: Blame,
    save_state: Callable[[], None],
) -> None:
    """Converge the virtual servers ``keys`` and their real servers, a chunk at a time."""
    ordered = sorted(keys, key=SERVICE_ORDER)
    intended = _intend(ordered, desired, obs, state, save_state)

    def apply(chunk: list[ServiceKey]) -> int:
        for key in chunk:
            if key not in desired.virtual_servers:
                continue
            want = desired.real_servers[key]
            have = obs.dests.get(key, {})
            if any(d not in want for d in have):
                # Draining decisions need the kernel's current connection counts.
                obs.dests[key] = backends.ipvs.dests(key)
        ops = service_ops(desired, chunk, obs.services, obs.dests, owned, expired)
        created = intended.intersection(chunk)  # first tried now: ours only if created
        intended.difference_update(created)
        try:
            apply_and_record(backends.ipvs.apply, ops, record)
        except ApplyError as exc:
            blame.refused(ops, exc)
            # Not created: maybe someone else's since (EEXIST), never ours.
            state.virtual_servers.difference_update(
                op.server.key
                for op in (ops[i] for i in exc.failed)
                if type(op) is ServiceOp and op.kind is OpKind.ADD and op.server.key in created
            )
            raise
        return len(ops)

    def fail(key: ServiceKey, exc: Exception) -> None:
        blame.service(key, f"{key}: {type(exc).__name__}: {exc}")

    apply_chunks(chunked(ordered, CHUNK_VIRTUAL_SERVERS), isolating(apply, fail))


def _intend(
    ordered: list[ServiceKey],
    desired: DesiredState,
    obs: Observed,
    state: State,
    save_state: Callable[[], None],
) -> set[ServiceKey]:
    """Record the virtual servers that this step creates (wanted, not in the kernel) as ours
    in the state file before the kernel is asked for any of them, in one save (returned: those
    not ours before). Killed between the write and the save, a later run must still know them
    (a NodePort's address is a node's, not on kube-ipvs0); one never created is forgotten at
    the next full sync (``observed.adopt_ours``)."""
    ours, want, have = state.virtual_servers, desired.virtual_servers, obs.services
    created = {k for k in ordered if k in want and k not in have and k not in ours}
    if created:
        ours.update(created)
        save_state()
    return created


def converge_members(
    changed: Mapping[str, set[str]],
    desired: DesiredState,
    obs: Observed,
    backends: Backends,
    blame: Blame,
) -> None:
    """Converge the ``changed`` entries of each ipset, a chunk at a time; a set of ours that
    is missing is created first (if it cannot be, its members fail their Services)."""

    def record(done: list[MemberOp]) -> None:
        for op in done:
            target = obs.members.setdefault(op.set_name, set())
            (target.add if op.kind is OpKind.ADD else target.discard)(op.entry)

    def apply(ops: list[MemberOp]) -> int:
        name = ops[0].set_name
        if name not in obs.members:
            try:
                backends.ipsets.ensure(obs.members.keys(), [name])
            except Exception as exc:
                for op in ops:
                    blame.member(op, f"ipset {name} cannot be created: {exc}")
                return 0
            obs.members[name] = set()
        try:
            apply_and_record(backends.ipsets.apply, ops, record)
        except ApplyError as exc:
            for i in exc.failed:
                blame.member(ops[i], refusal(exc, ops, i))
            raise
        return len(ops)

    chunks = (
        member_ops(desired, name, part, obs.members.get(name, set()))
        for name in sorted(changed)
        for part in chunked(sorted(changed[name]), CHUNK_MEMBERS)
    )
    apply_chunks((c for c in chunks if c), isolating(apply, blame.member))


def write_rules(
    text: str, obs: Observed, state: State, backends: Backends, problem: Problem
) -> None:
    """Write our chains as ``text`` unless the kernel holds them so, with the jumps to them
    that are missing; the state file records what was written, for the next full sync's
    comparison (``observed.same_rules``)."""
    if text == obs.rules_text:
        return
    ipt = backends.iptables
    try:
        missing = ipt.read().missing_jumps
    except Exception as exc:  # our chains are written all the same
        problem("iptables", f"reading iptables: {type(exc).__name__}: {exc}")
        obs.chains = {}  # unknown until written and read back
        _restore(text, ipt.missing_jumps_checked(), obs, backends)
        obs.rules_text = text
        state.iptables_fingerprint = ""  # the next full sync checks them again
        return
    obs.chains = {}
    _restore(text, missing, obs, backends)
    obs.rules_text = text
    state.rules_digest = hashlib.sha256(text.encode()).hexdigest()
    seen = ipt.read()
    state.iptables_fingerprint = seen.fingerprint
    obs.chains = seen.chains


def _restore(text: str, missing: Sequence[Jump], obs: Observed, backends: Backends) -> None:
    """One restore; a refused one leaves our chains unknown (a table may have been committed
    before the kernel refused the next): the next write rewrites them."""
    try:
        backends.iptables.apply(text, missing)
    except ApplyError:
        obs.rules_text = None
        raise


def write_rules_leaving_out(
    render: Callable[[frozenset[str]], str],
    groups: Sequence[str],
    write: Callable[[str], None],
) -> dict[str, str]:
    """Write the rules ``render(frozenset())`` renders (``write``: ``write_rules`` of a text);
    if the kernel refuses them, the rules it can hold: the base (every group in ``groups``
    left out; refused too, the ApplyError is raised: no Service can be blamed), then each
    group added on its own to those accepted so far. Returns the groups the kernel refused,
    and why; the rules written last are those it accepted."""
    try:
        write(render(frozenset()))
        return {}
    except ApplyError:
        if not groups:
            raise
    everything = frozenset(groups)
    write(render(everything))
    refused: dict[str, str] = {}
    accepted: set[str] = set()
    written = True
    for group in groups:
        try:
            write(render(everything - accepted - {group}))
        except ApplyError as exc:
            refused[group] = str(exc)
            written = False
            continue
        accepted.add(group)
        written = True
    if not written:
        write(render(frozenset(refused)))
    return refused
