"""``ipvsproxy status -c``: IPVS's connection table as ``ipvsadm -Lnc`` lists it, with the
Service and Pod names beside each entry.

Pure: ``parse`` reads the text of /proc/net/ip_vs_conn (what ipvsadm reads; IPv4 and IPv6
entries are in the same file), the command in ``ipvsproxy/status/command.py`` reads the file.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from ipvsproxy.core.identities import Identities
from ipvsproxy.core.virtual_servers import Protocol, ServiceKey

PROC_PATH = "/proc/net/ip_vs_conn"


class Connection(NamedTuple):
    protocol: str  # as the kernel names it: TCP, UDP, SCTP (or another IPVS protocol)
    client: str
    client_port: int
    virtual: str
    virtual_port: int
    destination: str
    destination_port: int
    state: str
    expires: int  # seconds


def _address(field: str) -> str:
    """``%08X`` (an IPv4 address in host order) or ``%pI6`` (eight groups of four)."""
    if ":" in field:
        return ipaddress.IPv6Address(field).compressed
    return str(ipaddress.IPv4Address(int(field, 16)))


def parse(text: str) -> list[Connection]:
    """The entries of /proc/net/ip_vs_conn; its header line and malformed lines are skipped."""
    found = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 9 or f[0] == "Pro":
            continue
        try:
            found.append(
                Connection(
                    f[0],
                    _address(f[1]),
                    int(f[2], 16),
                    _address(f[3]),
                    int(f[4], 16),
                    _address(f[5]),
                    int(f[6], 16),
                    f[7],
                    int(f[8]),
                )
            )
        except ValueError:
            continue
    return found


def virtual_key(c: Connection) -> ServiceKey | None:
    try:
        return ServiceKey(c.virtual, Protocol(c.protocol), c.virtual_port)
    except ValueError:
        return None


def _hostport(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def to_json(conns: Sequence[Connection], names: Identities) -> list[dict[str, Any]]:
    """Each entry with its Service (``namespace/name:port``) and Pod (``namespace/name``),
    null where unknown; sorted by virtual, then client address and port."""
    out = []
    for c in sorted(conns, key=lambda c: (c.virtual, c.virtual_port, c.client, c.client_port)):
        key = virtual_key(c)
        vs = names.virtual_server(key) if key is not None else None
        ep = names.endpoint(c.destination)
        out.append(
            {
                "protocol": c.protocol,
                "client": c.client,
                "clientPort": c.client_port,
                "virtual": c.virtual,
                "virtualPort": c.virtual_port,
                "destination": c.destination,
                "destinationPort": c.destination_port,
                "state": c.state,
                "expires": c.expires,
                "service": f"{vs.service}:{vs.port_name or vs.port}" if vs else None,
                "pod": ep.pod if ep else None,
            }
        )
    return out


def render(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """``ipvsadm -Lnc``'s lines (expire as mm:ss), with Service and Pod columns."""
    rows = [["pro", "expire", "state", "source", "virtual", "destination", "Service", "Pod"]]
    for e in entries:
        rows.append(
            [
                e["protocol"],
                f"{e['expires'] // 60:02d}:{e['expires'] % 60:02d}",
                e["state"],
                _hostport(e["client"], e["clientPort"]),
                _hostport(e["virtual"], e["virtualPort"]),
                _hostport(e["destination"], e["destinationPort"]),
                e["service"] or "?",
                e["pod"] or "?",
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["IPVS connection entries"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return lines
