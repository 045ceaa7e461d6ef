"""Kernel settings IPVS forwarding needs, written only when they differ (upstream's list), and
limits that are only ever raised (the conntrack table's)."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path

from ipvsproxy.kernel.errors import Counters

PROC = Path("/proc/sys")
# The conntrack hash table's size: a module parameter, not under /proc/sys; named by its path.
HASHSIZE = "/sys/module/nf_conntrack/parameters/hashsize"


def required(strict_arp: bool, kernel_release: str | None = None) -> dict[str, str]:
    values = {
        "net/ipv4/vs/conntrack": "1",
        "net/ipv4/vs/expire_nodest_conn": "1",
        "net/ipv4/vs/expire_quiescent_template": "1",
        "net/ipv4/ip_forward": "1",
    }
    release = kernel_release or os.uname().release
    major, minor = (int(x) for x in release.split(".")[:2])
    # conn_reuse_mode 0 works around connection delays on kernels before 5.9
    # (kubernetes #93297); later kernels fixed it and keep their own value.
    if (4, 1) <= (major, minor) < (5, 9):
        values["net/ipv4/vs/conn_reuse_mode"] = "0"
    if strict_arp:
        values["net/ipv4/conf/all/arp_ignore"] = "1"
        values["net/ipv4/conf/all/arp_announce"] = "2"
    return values


# Read, never written. Turning IPv6 forwarding on turns off router advertisements on every
# interface with accept_ra 1, so the node could lose its IPv6 default route; upstream's
# proxiers neither set nor check it. Off, the pods' IPv6 replies cannot cross the node.
IPV6_FORWARDING = "net/ipv6/conf/all/forwarding"


def expected(families: Collection[int]) -> dict[str, str]:
    """The settings the served ``families`` need that ipvsproxy checks but leaves alone."""
    return {IPV6_FORWARDING: "1"} if 6 in families else {}


def not_as_expected(name: str, value: str, wanted: str) -> str:
    """Why a setting ``expected`` returns is a problem while it reads ``value``."""
    return (
        f"sysctl {name} is {value}, not {wanted}: IPv6 Services' replies from pods are not "
        "forwarded (ipvsproxy does not set it: turning IPv6 forwarding on turns off router "
        "advertisements on the node's interfaces)"
    )


class Sysctls:
    """Kernel settings, as the files under ``root`` (/proc/sys; a name that is an absolute
    path, ``HASHSIZE``, is that file).

    Owns ``counters``; holds no values. ``ensure`` reads the settings it is given, writes
    only those that differ and returns their names; ``raise_to`` writes only those below their
    floor. A write the kernel refuses raises OSError at that setting (those before it stay
    written). Nothing else is read or written."""

    def __init__(self, root: Path = PROC) -> None:
        self.root = root
        self.counters = Counters()

    def _path(self, name: str) -> Path:
        return Path(name) if name.startswith("/") else self.root / name

    def read(self, names: Mapping[str, object]) -> dict[str, str]:
        return {n: self._path(n).read_text().strip() for n in names}

    def ensure(self, values: Mapping[str, str]) -> list[str]:
        """Set what differs; return the names written."""
        current = self.read(values)
        written = []
        for name, value in values.items():
            if current[name] != value:
                self._write(name, value)
                written.append(name)
        return written

    def raise_to(self, floors: Mapping[str, int]) -> list[str]:
        """Set each setting below its floor (or unreadable) to the floor, in order; never
        lower one; return the names written."""
        written = []
        for name, floor in floors.items():
            if below(self._current(name), floor):
                self._write(name, str(floor))
                written.append(name)
        return written

    def _current(self, name: str) -> str | None:
        try:
            return self._path(name).read_text().strip()
        except OSError:
            return None

    def _write(self, name: str, value: str) -> None:
        self._path(name).write_text(value)
        self.counters.count("sysctl", True)


def below(current: str | None, floor: int) -> bool:
    """Whether a limit reading ``current`` (None: unreadable) must be raised to ``floor``: as
    upstream, one that cannot be read is written."""
    try:
        return current is None or int(current) < floor
    except ValueError:
        return True
