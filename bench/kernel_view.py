"""A node's kernel as the side-by-side benchmark observes it, from outside any proxy: the whole
IPVS table (``/proc/net/ip_vs``, one read), one virtual server's real servers (one netlink
dump, cheap enough to poll every few milliseconds), and the ipsets and iptables rules as text.
"""

from __future__ import annotations

import errno
import ipaddress
import subprocess
from collections.abc import Iterator

from ipvsproxy.core.virtual_servers import ObservedDest, Protocol, RealServer, ServiceKey
from ipvsproxy.kernel.ipvs import IPVS
from lab.net import netns

VSKey = tuple[str, str, int]  # protocol, address, port
Dest = tuple[str, int]
Table = dict[VSKey, dict[Dest, int]]  # virtual server -> real server -> weight


def _hex_endpoint(text: str) -> tuple[str, int]:
    address, port = text.rsplit(":", 1)
    return str(ipaddress.IPv4Address(int(address, 16))), int(port, 16)


def parse_ip_vs(text: str) -> Table:
    """``/proc/net/ip_vs`` (IPv4): every virtual server and its real servers' weights."""
    table: Table = {}
    current: dict[Dest, int] | None = None
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] in ("TCP", "UDP", "SCTP") and len(parts) >= 2:
            address, port = _hex_endpoint(parts[1])
            current = table.setdefault((parts[0], address, port), {})
        elif parts[0] == "->" and current is not None and len(parts) >= 4 and ":" in parts[1]:
            if parts[1].startswith("RemoteAddress"):
                continue
            current[_hex_endpoint(parts[1])] = int(parts[3])
    return table


def ipvs_table(ns: str) -> Table:
    with netns.entered(ns), open("/proc/thread-self/net/ip_vs") as f:
        return parse_ip_vs(f.read())


class Prober:
    """One virtual server's real servers read over netlink in the node's namespace (the
    socket is opened there and stays bound to it)."""

    def __init__(self, ns: str) -> None:
        with netns.entered(ns):
            self.ipvs = IPVS()

    def exists(self, key: ServiceKey) -> bool:
        seq = self.ipvs.sock.next_seq()
        try:
            self.ipvs.sock.request(self.ipvs.encoder.get_service(seq, key), seq)
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                return False
            raise
        return True

    def active(self, vs: VSKey) -> set[Dest] | None:
        """The real servers of ``vs`` with a weight above 0; None: no such virtual server (a
        dump of the real servers of one that does not exist is empty, not an error)."""
        key = ServiceKey(vs[1], Protocol(vs[0]), vs[2])
        if not self.exists(key):
            return None
        found = self.ipvs.dests(key)
        out: set[Dest] = set()
        for dest in found.values():
            server = dest.server if isinstance(dest, ObservedDest) else dest
            weight = server.weight if isinstance(server, RealServer) else 1
            if weight > 0:
                out.add((server.key.address, server.key.port))
        return out

    def close(self) -> None:
        self.ipvs.close()


def text_state(ns: str) -> dict[str, set[str]]:
    """ipsets (``ipset save``) and iptables rules (``iptables-save`` without counters) as
    sets of lines, to count what a restart changed."""
    out: dict[str, set[str]] = {}
    for name, argv in (("ipset", ["ipset", "save"]), ("iptables", ["iptables-save"])):
        proc = subprocess.run(
            ["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, check=False
        )
        out[name] = {
            line for line in proc.stdout.splitlines() if line and not line.startswith(("#", ":"))
        }
    return out


def changed(before: Table, after: Table, ignore: set[str]) -> Iterator[str]:
    """What differs between two IPVS tables (virtual servers on ``ignore`` addresses left
    out): one line per virtual server or real server added, removed or reweighted."""
    for vs in sorted(set(before) | set(after)):
        if vs[1] in ignore:
            continue
        old, new = before.get(vs), after.get(vs)
        if old is None or new is None:
            yield f"{'+' if old is None else '-'} {vs}"
            continue
        for dest in sorted(set(old) | set(new)):
            if old.get(dest) != new.get(dest):
                yield f"~ {vs} {dest}: {old.get(dest)} -> {new.get(dest)}"
