"""``ipvsproxy status``: gathers the kernel's IPVS state, the daemon's /status document and the
state file, and prints what ``ipvsproxy.status.view`` makes of them.

Every source may be missing: without the daemon, names come from the state file; without that,
they are unknown. The header says which view is shown. Only reading the kernel is required.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from ipvsproxy.config import METRICS_PORT, ProxyConfig
from ipvsproxy.core.virtual_servers import Protocol, ServiceKey
from ipvsproxy.status import connections, view

DEFAULT_METRICS_ADDRESS = f"127.0.0.1:{METRICS_PORT}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-n", "--numeric", action="store_true", help="print ports as numbers")
    counters = p.add_mutually_exclusive_group()
    counters.add_argument(
        "--stats", action="store_true", help="connections, packets and bytes (ipvsadm --stats)"
    )
    counters.add_argument(
        "--rate", action="store_true", help="connections, packets and bytes per second"
    )
    p.add_argument("--service", metavar="NAMESPACE/NAME", help="only this Service's servers")
    p.add_argument(
        "--all",
        action="store_true",
        help="also kube-ipvs0's addresses, ipvsproxy's ipsets and iptables chains",
    )
    p.add_argument(
        "-c",
        "--connections",
        action="store_true",
        help="the connection table, as ipvsadm -Lnc, with Service and Pod names",
    )
    one = p.add_mutually_exclusive_group()
    for flags, proto in _VIRTUAL_SERVICE_FLAGS:
        one.add_argument(
            *flags,
            dest=f"only_{proto.value.lower()}",
            metavar="ADDR:PORT",
            help=f"only this {proto.value} virtual service, as ipvsadm ([ADDR]:PORT for IPv6)",
        )
    p.add_argument(
        "-o",
        "--output",
        choices=("table", "wide", "json"),
        default="table",
        help="table (default), wide (more columns) or json (the documented schema)",
    )
    p.add_argument(
        "--state-file",
        default=ProxyConfig.state_path,
        help=f"the daemon's state file (default {ProxyConfig.state_path})",
    )
    p.add_argument(
        "--metrics-address",
        "--status-address",
        dest="metrics_address",
        default=DEFAULT_METRICS_ADDRESS,
        help="where the daemon serves /status: next to /metrics "
        f"(default {DEFAULT_METRICS_ADDRESS}) unless its --status-bind-address moved it",
    )
    p.add_argument(
        "--daemon-timeout",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="seconds to wait for the daemon (default 2)",
    )
    p.add_argument(
        "--timeout",
        action="store_true",
        help="only the IPVS timeouts (tcp tcpfin udp), as ipvsadm -L --timeout",
    )


_VIRTUAL_SERVICE_FLAGS = (
    (("-t", "--tcp-service"), Protocol.TCP),
    (("-u", "--udp-service"), Protocol.UDP),
    (("--sctp-service",), Protocol.SCTP),
)


def _only(args: argparse.Namespace) -> ServiceKey | None:
    """The virtual service of -t/-u/--sctp-service, if one was given; ValueError if malformed."""
    for _flags, proto in _VIRTUAL_SERVICE_FLAGS:
        text = getattr(args, f"only_{proto.value.lower()}", None)
        if text is not None:
            return view.parse_virtual_address(text, proto)
    return None


def _fetch_daemon(
    url: str, timeout: float, fallback: str | None = None
) -> tuple[view.DaemonView | None, str | None]:
    """The daemon's document at ``url``, or at ``fallback`` where ``url`` is not served (a
    daemon without /status/all); else why not."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and fallback is not None:
            return _fetch_daemon(fallback, timeout)
        return None, str(exc)
    except urllib.error.URLError as exc:
        return None, str(exc.reason)
    except (OSError, ValueError) as exc:
        return None, str(exc)
    try:
        return view.parse_daemon_document(doc), None
    except ValueError as exc:
        return None, str(exc)


def _read_state(path: Path) -> tuple[Any, float | None, str | None]:
    from ipvsproxy.dataplane.statefile import StateFile

    if not path.exists():
        return None, None, None
    try:
        sf = StateFile(path)
        state = sf.load()
        if sf.unreadable:
            return None, None, sf.unreadable
        return state, path.stat().st_mtime, None
    except (OSError, ValueError) as exc:
        return None, None, str(exc)


def _read_kernel() -> tuple[dict[ServiceKey, Any], set[str]]:
    from ipvsproxy.kernel.addresses import Addresses
    from ipvsproxy.kernel.ipvs import IPVS

    ipvs = IPVS()
    try:
        kernel = {
            key: (vs, traffic, ipvs.dests_with_traffic(key))
            for key, (vs, traffic) in sorted(ipvs.services_with_traffic().items())
        }
    finally:
        ipvs.close()
    addresses = Addresses()
    try:
        bound = addresses.bound()
    finally:
        addresses.close()
    return kernel, bound


def _read_timeouts() -> tuple[int, int, int]:
    from ipvsproxy.kernel.ipvs import IPVS

    ipvs = IPVS()
    try:
        return ipvs.read_timeouts()
    finally:
        ipvs.close()


def _show_timeouts(output: str) -> int:
    try:
        tcp, tcp_fin, udp = _read_timeouts()
    except (OSError, ValueError) as exc:
        print(f"ipvsproxy status: cannot read IPVS from the kernel: {exc}", file=sys.stderr)
        return 1
    if output == "json":
        doc = {
            "schemaVersion": view.SCHEMA_VERSION,
            "timeouts": view.timeouts_json(tcp, tcp_fin, udp),
        }
        json.dump(doc, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print(view.timeouts_line(tcp, tcp_fin, udp))
    return 0


def _read_ipsets() -> tuple[dict[str, set[str]], str | None]:
    from ipvsproxy.kernel.ipset import IPSets

    try:
        ipsets = IPSets()
        try:
            return ipsets.read(), None
        finally:
            ipsets.close()
    except Exception as exc:  # reported in its part of the output, never a traceback
        return {}, str(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"


def _save(save: str, table: str) -> str:
    """``iptables-save -t TABLE`` (or ip6tables-save's); OSError when it fails."""
    proc = subprocess.run([save, "-t", table], capture_output=True, text=True)
    if proc.returncode != 0:
        raise OSError(f"{save} -t {table}: {proc.stderr.strip()}")
    return proc.stdout


def _read_chains() -> dict[tuple[int, str], str | OSError]:
    """iptables-save's and ip6tables-save's nat and filter tables, or why each could not be
    read."""
    saved: dict[tuple[int, str], str | OSError] = {}
    for family, save in ((4, "iptables-save"), (6, "ip6tables-save")):
        for table in ("nat", "filter"):
            try:
                saved[(family, table)] = _save(save, table)
            except OSError as exc:
                saved[(family, table)] = exc
    return saved


def read_extras(bound: frozenset[str]) -> view.Extras:
    """--all: what the kernel holds of ipvsproxy besides IPVS."""
    ipsets, ipsets_error = _read_ipsets()
    return view.Extras(bound, ipsets, ipsets_error, **view.chains_read(_read_chains()))


def _url(address: str, kernel: bool = False) -> str:
    """The daemon's /status, or with ``kernel`` (--all) /status/all: also its sets and
    chains."""
    host, _, port = address.rpartition(":")
    host = host or "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/status{'/all' if kernel else ''}"


def gather(args: argparse.Namespace) -> tuple[view.KernelView, view.Sources]:
    """Read every source; the daemon is asked before and after the kernel (with --all its
    sets and chains too) so that a sync landing in between is not reported as drift (tried
    three times, then shown as it is)."""
    url = _url(args.metrics_address)
    ask = _url(args.metrics_address, kernel=True) if args.all else url
    for _attempt in range(3):
        daemon, error = _fetch_daemon(ask, args.daemon_timeout, fallback=url)
        kernel, bound = _read_kernel()
        extras = read_extras(frozenset(bound)) if args.all else None
        if daemon is None:
            break
        again, _ = _fetch_daemon(url, args.daemon_timeout)
        if again is not None and (again.last_sync, again.pending) == (
            daemon.last_sync,
            daemon.pending,
        ):
            break
    state, mtime, state_error = _read_state(Path(args.state_file))
    ours = {k for k in kernel if k.address in bound}
    if state is not None:
        ours |= set(state.virtual_servers) & set(kernel)
    if daemon is not None:
        ours |= set(daemon.virtual_servers) & set(kernel)
    sources = view.Sources(
        daemon_url=url,
        daemon=daemon,
        daemon_error=error,
        state_path=str(args.state_file),
        state_identities=state.identities if state is not None else None,
        state_time=mtime,
        state_error=state_error,
        ours=frozenset(ours),
        bound=frozenset(bound),
        extras=extras,
    )
    return kernel, sources


def _port_name(port: int, protocol: str) -> str:
    """As ipvsadm without -n: the /etc/services name, where there is one for the protocol."""
    proto = protocol.lower()
    if proto not in ("tcp", "udp"):
        return str(port)
    try:
        return socket.getservbyport(port, proto)
    except OSError:
        return str(port)


def _usage_error(args: argparse.Namespace) -> str | None:
    if args.service is not None and args.service.count("/") != 1:
        return f"--service wants NAMESPACE/NAME, not {args.service!r}"
    try:
        _only(args)
    except ValueError as exc:
        return str(exc)
    return None


def run(args: argparse.Namespace) -> int:
    problem = _usage_error(args)
    if problem is not None:
        print(f"ipvsproxy status: {problem}", file=sys.stderr)
        return 2
    if args.timeout:
        return _show_timeouts(args.output)
    only = _only(args)
    try:
        kernel, sources = gather(args)
    except OSError as exc:
        print(f"ipvsproxy status: cannot read IPVS from the kernel: {exc}", file=sys.stderr)
        return 1
    if only is not None and only not in kernel:
        print(f"ipvsproxy status: No such service: {only}", file=sys.stderr)
        return 1
    report = view.build_report(kernel, sources, time.time(), args.service, only)
    if args.service is not None and not report["virtualServers"]:
        known = "names unknown" if report["view"] == view.VIEW_KERNEL else f"{report['view']} view"
        print(
            f"ipvsproxy status: no virtual server of service {args.service} on this node ({known})",
            file=sys.stderr,
        )
        return 1
    if args.connections:
        return _show_connections(args, report, sources, narrowed=bool(args.service or only))
    if sources.extras is not None:
        report["all"] = view.all_json(sources.extras, sources.daemon)
    if args.output == "json":
        _dump(report)
        return 0
    counters = "stats" if args.stats else "rate" if args.rate else None
    namer = view.numeric_port if args.numeric else _port_name
    print(view.render_table(report, counters, args.output == "wide", namer))
    if "all" in report:
        print("\n".join(view.render_all(report["all"])))
    return 0


def _dump(doc: dict[str, Any]) -> None:
    json.dump(doc, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


def _show_connections(
    args: argparse.Namespace, report: dict[str, Any], sources: view.Sources, narrowed: bool
) -> int:
    """-c: the report's header and IPVS's connection entries (those of the virtual servers
    listed, under --service or -t/-u)."""
    try:
        text = Path(connections.PROC_PATH).read_text()
    except OSError as exc:
        print(f"ipvsproxy status: cannot read {connections.PROC_PATH}: {exc}", file=sys.stderr)
        return 1
    conns = connections.parse(text)
    if narrowed:
        listed = {(v["protocol"], v["address"], v["port"]) for v in report["virtualServers"]}
        conns = [c for c in conns if (c.protocol, c.virtual, c.virtual_port) in listed]
    report["connections"] = connections.to_json(conns, view.identities(sources))
    if args.output == "json":
        _dump(report)
    else:
        print("\n".join([*view.header_lines(report), *connections.render(report["connections"])]))
    return 0
