"""What ``ipvsproxy status`` shows, built from values: the kernel's virtual servers, the names
and desired state the daemon serves (or the state file keeps), and nothing read here.

Pure, so the report, the drift count and the table are tested without a kernel; the command
in ``ipvsproxy/status/command.py`` gathers the inputs. The JSON report is a stable
interface: its schema is documented in the README (``schemaVersion`` changes when a field changes
meaning or goes).
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ipvsproxy.core import ipset_specs, ruleset
from ipvsproxy.core.diff import DestOp, OpKind, diff_dests, diff_members, diff_services
from ipvsproxy.core.identities import (
    EndpointIdentity,
    Identities,
    ServiceIdentity,
    VirtualServerIdentity,
    identities_from_json,
    identities_to_json,
)
from ipvsproxy.core.ruleset import ChainKey, Jump
from ipvsproxy.core.virtual_servers import (
    FWD_DROUTE,
    FWD_LOCALNODE,
    FWD_MASQ,
    FWD_TUNNEL,
    SVC_F_PERSISTENT,
    DestKey,
    ObservedDest,
    Protocol,
    RealServer,
    RealServerLike,
    ServiceKey,
    Traffic,
    VirtualServer,
)

SCHEMA_VERSION = 1
DAEMON_DOCUMENT_VERSION = 1

VIEW_DAEMON = "daemon"
VIEW_STATE_FILE = "state-file"
VIEW_KERNEL = "kernel"

FORWARD_NAMES = {
    FWD_MASQ: "Masq",
    FWD_LOCALNODE: "Local",
    FWD_TUNNEL: "Tunnel",
    FWD_DROUTE: "Route",
}

# What the kernel holds: virtual server -> (its settings, its counters, its real servers).
KernelDests = Mapping[DestKey, tuple[ObservedDest, Traffic]]
KernelView = Mapping[ServiceKey, tuple[VirtualServer, Traffic, KernelDests]]


def rfc3339(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# -- the daemon's /status document ---------------------------------------------------------


def daemon_document(
    node: str,
    virtual_servers: Mapping[ServiceKey, VirtualServer],
    real_servers: Mapping[ServiceKey, Mapping[DestKey, RealServerLike]],
    identities: Mapping[str, ServiceIdentity],
    last_sync: float | None,
    pending: int,
    invalid: Mapping[str, str],
    addresses: Collection[str] = (),
    state_file_problem: str | None = None,
) -> dict[str, Any]:
    """What the daemon serves at /status: its desired IPVS state, the addresses kube-ipvs0
    should hold, the names of things and what of its state file it cannot read or write."""
    desired = [
        [
            k.address,
            k.protocol.value,
            k.port,
            vs.scheduler,
            vs.flags,
            vs.timeout,
            vs.netmask,
            [[d.address, d.port, rs.weight] for d, rs in sorted(real_servers.get(k, {}).items())],
        ]
        for k, vs in sorted(virtual_servers.items())
    ]
    return {
        "version": DAEMON_DOCUMENT_VERSION,
        "node": node,
        "lastSync": last_sync,
        "pendingChanges": pending,
        "invalidServices": dict(sorted(invalid.items())),
        "stateFileProblem": state_file_problem,
        "desired": desired,
        "addresses": sorted(addresses),
        "identities": identities_to_json(identities),
    }


def kernel_document(
    sets: Mapping[str, Collection[str]], chains: Mapping[ChainKey, str | None] | None
) -> dict[str, Any]:
    """What the daemon adds at /status/all, for ``status --all``'s drift: the sets a full
    sync keeps with their members, and each chain it would restore with the digest of its
    kernel copy as last written (null: it would rewrite it; ``chains`` null: not known yet)."""
    return {
        "ipsets": {name: sorted(members) for name, members in sorted(sets.items())},
        "chains": None
        if chains is None
        else [[f, t, c, digest] for (f, t, c), digest in sorted(chains.items())],
    }


@dataclass(frozen=True)
class DaemonView:
    node: str
    last_sync: float | None
    pending: int
    invalid: Mapping[str, str]
    virtual_servers: Mapping[ServiceKey, VirtualServer]
    real_servers: Mapping[ServiceKey, Mapping[DestKey, RealServerLike]]
    identities: Mapping[str, ServiceIdentity]
    addresses: frozenset[str] | None = None  # None from a daemon that does not serve them
    # ``kernel_document``'s: None where not served (or, for chains, not known yet)
    sets: Mapping[str, frozenset[str]] | None = None
    chains: Mapping[ChainKey, str | None] | None = None
    state_file_problem: str | None = None  # what of its state file it cannot read or write


def parse_daemon_document(doc: Mapping[str, Any]) -> DaemonView:
    """Raises ValueError on a document this version cannot read."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"malformed daemon status document: not an object but {doc!r:.80}")
    if doc.get("version") != DAEMON_DOCUMENT_VERSION:
        raise ValueError(f"unsupported daemon status version {doc.get('version')!r}")
    try:
        vss: dict[ServiceKey, VirtualServer] = {}
        rss: dict[ServiceKey, dict[DestKey, RealServerLike]] = {}
        for addr, proto, port, sched, flags, timeout, netmask, dests in doc["desired"]:
            key = ServiceKey(str(addr), Protocol(proto), int(port))
            vss[key] = VirtualServer(key, str(sched), int(flags), int(timeout), int(netmask))
            rss[key] = {
                DestKey(str(a), int(p)): RealServer(DestKey(str(a), int(p)), int(w))
                for a, p, w in dests
            }
        last = doc.get("lastSync")
        addresses = doc.get("addresses")
        return DaemonView(
            node=str(doc.get("node") or ""),
            last_sync=None if last is None else float(last),
            pending=int(doc.get("pendingChanges") or 0),
            invalid={str(k): str(v) for k, v in (doc.get("invalidServices") or {}).items()},
            virtual_servers=vss,
            real_servers=rss,
            identities=identities_from_json(doc.get("identities") or {}),
            addresses=None if addresses is None else frozenset(map(str, addresses)),
            sets=_parse_sets(doc.get("ipsets")),
            chains=_parse_chains(doc.get("chains")),
            state_file_problem=_optional_text(doc.get("stateFileProblem")),
        )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed daemon status document: {exc!r}") from exc


def _optional_text(value: Any) -> str | None:
    return None if value is None else str(value)


def _parse_sets(doc: Any) -> dict[str, frozenset[str]] | None:
    if doc is None:
        return None
    return {str(name): frozenset(map(str, members)) for name, members in doc.items()}


def _parse_chains(doc: Any) -> dict[ChainKey, str | None] | None:
    if doc is None:
        return None
    return {
        (int(f), str(t), str(c)): None if digest is None else str(digest) for f, t, c, digest in doc
    }


# -- drift -----------------------------------------------------------------------------------


def drift(daemon: DaemonView, kernel: KernelView, ours: Collection[ServiceKey]) -> list[str]:
    """The operations a full reconcile would write to IPVS now, as text.

    A real server at weight 0 that the daemon no longer wants is draining by design (graceful
    termination), not drift.
    """
    observed = {
        k: vs for k, (vs, _t, _d) in kernel.items() if k in ours or k in daemon.virtual_servers
    }
    ops: list[str] = [
        str(op) for op in diff_services(daemon.virtual_servers, observed, ours.__contains__)
    ]
    for key, want in sorted(daemon.real_servers.items()):
        if key not in kernel:
            continue
        have = {d: od for d, (od, _t) in kernel[key][2].items()}
        for op in diff_dests(key, want, have):
            if not _draining(op, want, have):
                ops.append(str(op))
    return ops


def _draining(
    op: DestOp, want: Mapping[DestKey, RealServerLike], have: Mapping[DestKey, ObservedDest]
) -> bool:
    key = op.server.key
    return (
        key not in want
        and key in have
        and have[key].server.weight == 0
        and op.kind
        in (
            OpKind.SET,
            OpKind.DELETE,
        )
    )


# -- the report (the JSON output) --------------------------------------------------------------


@dataclass(frozen=True)
class Sources:
    """Where the report's parts came from, for its header."""

    daemon_url: str
    daemon: DaemonView | None = None
    daemon_error: str | None = None
    state_path: str | None = None
    state_identities: Mapping[str, ServiceIdentity] | None = None
    state_time: float | None = None
    state_error: str | None = None
    ours: frozenset[ServiceKey] = field(default_factory=frozenset)
    bound: frozenset[str] = field(default_factory=frozenset)  # kube-ipvs0's addresses
    extras: Extras | None = None  # --all's, read with the kernel's IPVS state


def _traffic_json(t: Traffic) -> tuple[dict[str, int], dict[str, int]]:
    stats = {
        "connections": t.connections,
        "inPackets": t.in_packets,
        "outPackets": t.out_packets,
        "inBytes": t.in_bytes,
        "outBytes": t.out_bytes,
    }
    rate = {
        "connectionsPerSecond": t.cps,
        "inPacketsPerSecond": t.in_pps,
        "outPacketsPerSecond": t.out_pps,
        "inBytesPerSecond": t.in_bps,
        "outBytesPerSecond": t.out_bps,
    }
    return stats, rate


def _vs_json(
    vs: VirtualServer, t: Traffic, ident: VirtualServerIdentity | None, ours: bool
) -> dict[str, Any]:
    stats, rate = _traffic_json(t)
    persistent = bool(vs.flags & SVC_F_PERSISTENT)
    return {
        "protocol": vs.key.protocol.value,
        "address": vs.key.address,
        "port": vs.key.port,
        "scheduler": vs.scheduler,
        "flags": vs.flags,
        "persistent": persistent,
        "persistenceTimeout": vs.timeout if persistent else 0,
        "netmask": vs.prefix_len,
        "ours": ours,
        "service": ident.service if ident else None,
        "portName": ident.port_name if ident else None,
        "servicePort": ident.port if ident else None,
        "type": ident.type if ident else None,
        "role": ident.role if ident else None,
        "topology": (ident.topology or None) if ident else None,
        "stats": stats,
        "rate": rate,
        "realServers": [],
    }


def _rs_json(od: ObservedDest, t: Traffic, ident: EndpointIdentity | None) -> dict[str, Any]:
    stats, rate = _traffic_json(t)
    rs = od.server
    return {
        "address": rs.key.address,
        "port": rs.key.port,
        "forward": FORWARD_NAMES.get(rs.fwd_method, str(rs.fwd_method)),
        "weight": rs.weight,
        "terminating": rs.weight == 0,
        "activeConnections": od.stats.active,
        "inactiveConnections": od.stats.inactive,
        "persistentConnections": od.stats.persistent,
        "pod": ident.pod if ident else None,
        "node": ident.node if ident else None,
        "stats": stats,
        "rate": rate,
    }


def _daemon_json(src: Sources, now: float) -> dict[str, Any]:
    d = src.daemon
    return {
        "running": d is not None,
        "url": src.daemon_url,
        "error": src.daemon_error,
        "lastSync": rfc3339(d.last_sync) if d else None,
        "secondsSinceSync": round(now - d.last_sync, 3) if d and d.last_sync else None,
        "pendingChanges": d.pending if d else None,
        "invalidServices": dict(d.invalid) if d else {},
    }


def identities(src: Sources) -> Identities:
    """The names the report shows: the daemon's, else the state file's, else none."""
    if src.daemon is not None:
        return Identities(src.daemon.identities.values())
    return Identities((src.state_identities or {}).values())


def parse_virtual_address(text: str, protocol: Protocol) -> ServiceKey:
    """``ADDR:PORT`` or ``[ADDR6]:PORT`` as ipvsadm's ``-t``/``-u``/``--sctp-service`` take
    it (numeric address and port); raises ValueError naming what is wrong."""
    host, sep, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"an IPv6 virtual address is written [ADDR]:PORT, not {text!r}")
    try:
        address = ipaddress.ip_address(host)
        number = int(port)
    except ValueError:
        raise ValueError(f"illegal virtual server address {text!r} (want ADDR:PORT)") from None
    if not sep or not 0 < number < 65536:
        raise ValueError(f"illegal virtual server port in {text!r}")
    return ServiceKey(address.compressed, protocol, number)


def build_report(
    kernel: KernelView,
    src: Sources,
    now: float,
    service: str | None = None,
    only: ServiceKey | None = None,
) -> dict[str, Any]:
    """The status report; ``service`` (namespace/name) keeps only that Service's servers,
    ``only`` only that virtual server (drift is still counted over all of them)."""
    if src.daemon is not None:
        view, by_service = VIEW_DAEMON, src.daemon.identities
        ops: list[str] | None = drift(src.daemon, kernel, src.ours)
    elif src.state_identities is not None:
        view, by_service, ops = VIEW_STATE_FILE, src.state_identities, None
    else:
        view, by_service, ops = VIEW_KERNEL, {}, None
    names = Identities(by_service.values())
    servers = []
    for key, (vs, traffic, dests) in sorted(kernel.items()):
        ident = names.virtual_server(key)
        if only is not None and key != only:
            continue
        if service is not None and (ident is None or ident.service != service):
            continue
        entry = _vs_json(vs, traffic, ident, key in src.ours)
        entry["realServers"] = [
            _rs_json(od, t, names.endpoint(d.address)) for d, (od, t) in sorted(dests.items())
        ]
        servers.append(entry)
    return {
        "schemaVersion": SCHEMA_VERSION,
        "node": src.daemon.node if src.daemon else None,
        "view": view,
        "generatedAt": rfc3339(now),
        "daemon": _daemon_json(src, now),
        "stateFile": {
            "path": src.state_path,
            "modified": rfc3339(src.state_time),
            "error": src.state_error,
            "daemonProblem": src.daemon.state_file_problem if src.daemon else None,
        },
        "drift": {"count": None if ops is None else len(ops), "operations": ops or []},
        "virtualServers": servers,
    }


# -- the rest of ipvsproxy's kernel state (--all) ---------------------------------------------


@dataclass(frozen=True)
class Extras:
    """kube-ipvs0's addresses, ipvsproxy's ipsets (name -> members) and its iptables chains
    ((family, table, chain) -> rules, and their digests) with the jumps to them that are
    missing, as read; an error instead where one could not be."""

    addresses: frozenset[str]
    ipsets: Mapping[str, Collection[str]] = field(default_factory=dict)
    ipsets_error: str | None = None
    chains: Mapping[ChainKey, int] = field(default_factory=dict)
    chains_error: str | None = None
    digests: Mapping[ChainKey, str] = field(default_factory=dict)
    missing_jumps: Sequence[Jump] = ()
    unread_tables: frozenset[tuple[int, str]] = frozenset()  # (family, table) not read


def chains_read(saved: Mapping[tuple[int, str], str | OSError]) -> dict[str, Any]:
    """``Extras``' chain fields from each (family, table)'s ``iptables-save -t TABLE`` text,
    or the error reading it: our chains' rule counts and digests, the jumps to them missing,
    the tables not read and why."""
    chains: dict[ChainKey, int] = {}
    digests: dict[ChainKey, str] = {}
    missing: list[Jump] = []
    errors: list[str] = []
    for (family, table), text in sorted(saved.items()):
        if isinstance(text, OSError):
            errors.append(str(text))
            continue
        for chain, lines in ruleset.chain_lines(table, text).items():
            chains[(family, table, chain)] = sum(ln.startswith("-A ") for ln in lines)
        digests.update(ruleset.chain_digests({table: text}, family))
        missing += ruleset.missing_jumps(table, text, family)
    return {
        "chains": chains,
        "chains_error": "; ".join(errors) or None,
        "digests": digests,
        "missing_jumps": missing,
        "unread_tables": frozenset(k for k, text in saved.items() if isinstance(text, OSError)),
    }


def address_drift(want: Collection[str] | None, have: Collection[str]) -> list[str] | None:
    """The binds and unbinds a reconcile would make on kube-ipvs0; None when unknown."""
    if want is None:
        return None
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    return [f"bind {a} to kube-ipvs0" for a in missing] + [
        f"unbind {a} from kube-ipvs0" for a in extra
    ]


def ipset_drift(
    want: Mapping[str, Collection[str]] | None, have: Mapping[str, Collection[str]]
) -> list[str] | None:
    """The ipset operations a full sync would make (None when unknown): each set of ``want``
    the kernel lacks is created; every set of ours holds what ``want`` names for it, nothing
    when it names none (``diff_members``, as the dataplane's). Sets not ours are never
    looked at."""
    if want is None:
        return None
    ops: list[str] = []
    for name in sorted(ipset_specs.NAMES):
        held = have.get(name)
        if name in want and held is None:
            ops.append(f"create ipset {name}")
        ops += [str(op) for op in diff_members(name, want.get(name, ()), held or ())]
    return ops


def _where(family: int, table: str) -> str:
    return f"IPv{family} {table}"


def chain_drift(
    want: Mapping[ChainKey, str | None] | None,
    have: Mapping[ChainKey, str],
    missing: Sequence[Jump],
    unread: Collection[tuple[int, str]] = (),
) -> list[str] | None:
    """The chains a full sync would restore (None when unknown, or when a table of ``want``
    is ``unread``): each of ``want`` whose kernel copy's digest (``have``) is not the one it
    left there, or that it would rewrite anyway (None), and the jumps to them missing in the
    families it serves."""
    if want is None or any((f, t) in unread for f, t, _c in want):
        return None
    ops: list[str] = []
    for (family, table, chain), digest in sorted(want.items()):
        held = have.get((family, table, chain))
        if held is None:
            ops.append(f"create chain {chain} in {_where(family, table)}")
        elif held != digest:
            ops.append(f"rewrite chain {chain} in {_where(family, table)}")
    families = {family for family, _t, _c in want}
    ops += [
        f"insert jump {j.chain} -> {j.target} in {_where(j.family, j.table)}"
        for j in missing
        if j.family in families
    ]
    return ops


def _drift_json(ops: list[str] | None) -> dict[str, Any]:
    return {"count": None if ops is None else len(ops), "operations": ops or []}


def all_json(extras: Extras, daemon: DaemonView | None) -> dict[str, Any]:
    """``--all``'s part of the report. Drift is counted against the daemon's desired binds,
    sets and chains; unknown (null) without the daemon, from a daemon that does not serve
    them, or where the kernel could not be read (a table of a family the daemon does not
    serve may fail: its chains are not the daemon's to restore)."""
    ops = address_drift(daemon.addresses if daemon else None, extras.addresses)
    set_ops = chain_ops = None
    if daemon is not None and extras.ipsets_error is None:
        set_ops = ipset_drift(daemon.sets, extras.ipsets)
    if daemon is not None:
        chain_ops = chain_drift(
            daemon.chains, extras.digests, extras.missing_jumps, extras.unread_tables
        )
    return {
        "kubeIpvs0": {"addresses": sorted(extras.addresses), "drift": _drift_json(ops)},
        "ipsets": {
            "sets": [{"name": n, "members": len(m)} for n, m in sorted(extras.ipsets.items())],
            "error": extras.ipsets_error,
            "drift": _drift_json(set_ops),
        },
        "chains": {
            "chains": [
                {"family": f"IPv{fam}", "table": t, "chain": c, "rules": n}
                for (fam, t, c), n in sorted(extras.chains.items())
            ],
            "error": extras.chains_error,
            "drift": _drift_json(chain_ops),
        },
    }


def _drift_text(drift: Mapping[str, Any]) -> str:
    return "drift unknown" if drift["count"] is None else f"drift {drift['count']}"


SHOWN_OPERATIONS = 10  # drift operations listed in the text, each part's first


def _operation_lines(drift: Mapping[str, Any]) -> list[str]:
    ops = drift["operations"]
    lines = [f"  ! {op}" for op in ops[:SHOWN_OPERATIONS]]
    if len(ops) > SHOWN_OPERATIONS:
        lines.append(f"  ! ... and {len(ops) - SHOWN_OPERATIONS} more")
    return lines


def render_all(part: Mapping[str, Any]) -> list[str]:
    """``--all``'s lines, after the virtual servers."""
    k = part["kubeIpvs0"]
    lines = ["", f"kube-ipvs0: {len(k['addresses'])} addresses ({_drift_text(k['drift'])})"]
    lines += [f"  {a}" for a in k["addresses"]] + _operation_lines(k["drift"])
    s = part["ipsets"]
    lines.append(f"ipsets: {len(s['sets'])} ({_drift_text(s['drift'])})")
    lines += [f"  error: {s['error']}"] if s["error"] else []
    sets = [["  " + e["name"], f"{e['members']} members"] for e in s["sets"]]
    lines += (_aligned(sets) if sets else []) + _operation_lines(s["drift"])
    c = part["chains"]
    lines.append(f"iptables chains: {len(c['chains'])} ({_drift_text(c['drift'])})")
    lines += [f"  error: {c['error']}"] if c["error"] else []
    rows = [
        [f"  {e['family']}", e["table"], e["chain"], f"{e['rules']} rules"] for e in c["chains"]
    ]
    lines += (_aligned(rows) if rows else []) + _operation_lines(c["drift"])
    return lines


# -- IPVS timeouts (--timeout) -----------------------------------------------------------------


def timeouts_line(tcp: int, tcp_fin: int, udp: int) -> str:
    """As ``ipvsadm -L --timeout`` prints them."""
    return f"Timeout (tcp tcpfin udp): {tcp} {tcp_fin} {udp}"


def timeouts_json(tcp: int, tcp_fin: int, udp: int) -> dict[str, int]:
    return {"tcp": tcp, "tcpFin": tcp_fin, "udp": udp}


# -- the table -------------------------------------------------------------------------------

PortNamer = Callable[[int, str], str]  # (port, protocol) -> what to print for the port


def numeric_port(port: int, _protocol: str) -> str:
    return str(port)


def _hostport(address: str, port: int, proto: str, namer: PortNamer) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{host}:{namer(port, proto)}"


def header_lines(report: Mapping[str, Any]) -> list[str]:
    d = report["daemon"]
    node = report["node"] or "this node"
    if d["running"]:
        since = d["secondsSinceSync"]
        synced = "not synced yet" if since is None else f"last sync {since:.1f} s ago"
        state = f"daemon running, {synced}, {d['pendingChanges']} changes pending"
    else:
        state = f"daemon not running ({d['error']})"
    count = report["drift"]["count"]
    if count is None:
        drifted = "drift unknown without the daemon"
    elif count == 0:
        drifted = "kernel matches the desired state (drift 0)"
    else:
        drifted = f"kernel differs from the desired state (drift {count})"
    lines = [f"ipvsproxy on {node}: {state}; {drifted}"]
    sf = report["stateFile"]
    if report["view"] == VIEW_DAEMON:
        lines.append("view: daemon (desired state and names from the daemon; kernel read now)")
    elif report["view"] == VIEW_STATE_FILE:
        lines.append(f"view: kernel + state file (names as of {sf['modified']} from {sf['path']})")
    else:
        why = sf["error"] or f"no state file at {sf['path']}"
        lines.append(f"view: kernel only ({why}; names unknown)")
    if sf.get("daemonProblem"):
        lines.append(f"state file: {sf['daemonProblem']}")
    for service, why in sorted(d["invalidServices"].items()):
        lines.append(f"invalid service {service}: {why}")
    return lines


def _weight(rs: Mapping[str, Any]) -> str:
    return "0 (terminating)" if rs["terminating"] else str(rs["weight"])


def _flags(vs: Mapping[str, Any]) -> str:
    parts = []
    if vs["persistent"]:
        parts.append(f"persistent {vs['persistenceTimeout']}")
        full = 128 if ":" in vs["address"] else 32
        if vs["netmask"] != full:
            parts.append(f"mask /{vs['netmask']}")
    return " ".join(parts)


_COUNTERS = {
    "stats": (
        ("Conns", "connections"),
        ("InPkts", "inPackets"),
        ("OutPkts", "outPackets"),
        ("InBytes", "inBytes"),
        ("OutBytes", "outBytes"),
    ),
    "rate": (
        ("CPS", "connectionsPerSecond"),
        ("InPPS", "inPacketsPerSecond"),
        ("OutPPS", "outPacketsPerSecond"),
        ("InBPS", "inBytesPerSecond"),
        ("OutBPS", "outBytesPerSecond"),
    ),
}


def _vs_cells(
    vs: Mapping[str, Any], counters: str | None, wide: bool, namer: PortNamer
) -> list[str]:
    cells = [vs["protocol"], _hostport(vs["address"], vs["port"], vs["protocol"], namer)]
    if counters:
        cells += [str(vs[counters][k]) for _h, k in _COUNTERS[counters]]
    else:
        cells += [vs["scheduler"], _flags(vs)]
    label = f"{vs['service']}:{vs['portName'] or vs['servicePort']}" if vs["service"] else "?"
    if not vs["ours"] and not vs["service"]:
        label = "(not ipvsproxy's)"
    cells += [label, vs["type"] or "?", vs.get("topology") or "?"]
    if wide:
        cells += [vs["role"] or "?", f"0x{vs['flags']:x}"]
    return cells


def _rs_cells(
    rs: Mapping[str, Any], proto: str, counters: str | None, wide: bool, namer: PortNamer
) -> list[str]:
    cells = ["  ->", _hostport(rs["address"], rs["port"], proto, namer)]
    if counters:
        cells += [str(rs[counters][k]) for _h, k in _COUNTERS[counters]]
    else:
        cells += [
            rs["forward"],
            _weight(rs),
            str(rs["activeConnections"]),
            str(rs["inactiveConnections"]),
        ]
    cells += [rs["pod"] or "?", rs["node"] or "?"]
    if wide:
        cells += [str(rs["persistentConnections"])]
    return cells


def _headers(counters: str | None, wide: bool) -> tuple[list[str], list[str]]:
    vs = ["Prot", "LocalAddress:Port"]
    rs = ["  ->", "RemoteAddress:Port"]
    if counters:
        names = [h for h, _k in _COUNTERS[counters]]
        vs += names
        rs += names
    else:
        vs += ["Scheduler", "Flags"]
        rs += ["Forward", "Weight", "ActiveConn", "InActConn"]
    vs += ["Service", "Type", "Endpoints"]
    rs += ["Pod", "Node"]
    if wide:
        vs += ["Role", "RawFlags"]
        rs += ["PersistConn"]
    return vs, rs


def _aligned(rows: Sequence[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def render_table(
    report: Mapping[str, Any],
    counters: str | None = None,
    wide: bool = False,
    namer: PortNamer = numeric_port,
) -> str:
    """An ``ipvsadm -Ln``-like table; ``counters`` is None, "stats" or "rate".

    Virtual-server rows and real-server rows each align under their own header line, as
    ipvsadm's two header lines do; columns are separated by at least two spaces.
    """
    vs_head, rs_head = _headers(counters, wide)
    vs_rows, rs_rows, order = [vs_head], [rs_head], []
    for vs in report["virtualServers"]:
        order.append(("vs", len(vs_rows)))
        vs_rows.append(_vs_cells(vs, counters, wide, namer))
        for rs in vs["realServers"]:
            order.append(("rs", len(rs_rows)))
            rs_rows.append(_rs_cells(rs, vs["protocol"], counters, wide, namer))
    vs_text, rs_text = _aligned(vs_rows), _aligned(rs_rows)
    lines = [*header_lines(report), vs_text[0], rs_text[0]]
    lines += [vs_text[i] if kind == "vs" else rs_text[i] for kind, i in order]
    if not report["virtualServers"]:
        lines.append("(no virtual servers)")
    return "\n".join(lines)
