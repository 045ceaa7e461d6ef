"""Writes the kernel settings ipvsproxy needs through the host's /proc/sys/net, before it starts.

Usage (from entrypoint.sh): ``python3 prepare_sysctls.py HOST_PROC_SYS [ipvsproxy run ARGS...]``

Why this exists: ipvsproxy sets ``net.ipv4.vs.conntrack``, ``expire_nodest_conn``,
``expire_quiescent_template``, ``ip_forward`` (and ``conn_reuse_mode``, ``arp_ignore``/
``arp_announce`` where they apply), the conntrack timeouts, and raises ``nf_conntrack_max``
(never lowers it) at start, through ``/proc/sys``. Container runtimes mount ``/proc/sys``
read-only in any container that is not privileged, whatever its capabilities, so those writes
would fail there, and ipvsproxy exits when one does (as upstream). The DaemonSet mounts the
host's ``/proc/sys/net`` read-write at ``HOST_PROC_SYS/net`` instead (as Cilium's agent does);
this script writes the very values ipvsproxy would, computed by ipvsproxy's own functions from
the same arguments. ipvsproxy then reads them back from ``/proc/sys``, finds them set, and
writes nothing. The conntrack hash size is under /sys, not mounted here: ipvsproxy raises it
itself where it must (deploy/README.md, "Sysctls").

It never stops the start: an invalid configuration is left for ipvsproxy to report (it names
the field), and a setting that cannot be written is printed and left to ipvsproxy, which
exits naming it and why.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ipvsproxy import config
from ipvsproxy.daemon.kernel_settings import conntrack_floors, conntrack_sysctls
from ipvsproxy.kernel.sysctl import Sysctls, required

PREFIX = "ipvsproxy-entrypoint:"


def wanted(
    cfg: config.ProxyConfig, cores: int, kernel_release: str | None = None
) -> dict[str, str]:
    """Every setting ipvsproxy writes for ``cfg`` when it differs, and every limit under net/
    it raises to a floor when it is below (``cores``' nf_conntrack_max): the same functions
    ipvsproxy calls at start, so the two cannot drift apart."""
    floors = {n: str(f) for n, f in conntrack_floors(cfg, cores).items() if n.startswith("net/")}
    return {**floors, **conntrack_sysctls(cfg), **required(cfg.strict_arp, kernel_release)}


def load_ipvs() -> None:
    """Make the kernel load ip_vs, which creates net/ipv4/vs/*: resolving its generic netlink
    family does it (the module declares the family alias, so the kernel's own modprobe runs;
    no CAP_SYS_MODULE needed)."""
    from ipvsproxy.kernel.ipvs import IPVS

    IPVS().close()


def prepare(
    root: Path,
    argv: Sequence[str],
    *,
    cores: int | None = None,
    kernel_release: str | None = None,
    load: Callable[[], None] = load_ipvs,
) -> dict[str, str]:
    """Write what differs under ``root`` (a /proc/sys whose net/ is the host's); return what
    was written, name -> value. Problems are printed, never raised."""
    try:
        cfg = config.load(argv)
    except config.ConfigError as exc:
        print(
            f"{PREFIX} not preparing sysctls, the configuration is invalid: {exc}", file=sys.stderr
        )
        return {}
    try:
        load()
    except OSError as exc:
        print(f"{PREFIX} cannot load ip_vs: {exc}", file=sys.stderr)
    sysctls = Sysctls(root)
    cores = cores or os.cpu_count() or 1
    floors = conntrack_floors(cfg, cores)
    written: dict[str, str] = {}
    for name, value in wanted(cfg, cores, kernel_release).items():
        if not name.startswith("net/"):  # only net/ is mounted from the host
            print(f"{PREFIX} {name} is not under net/, left to ipvsproxy", file=sys.stderr)
            continue
        try:
            if name in floors:  # a limit: raised, never lowered
                changed = sysctls.raise_to({name: floors[name]})
            else:
                changed = sysctls.ensure({name: value})
            if changed:
                written[name] = value
        except OSError as exc:
            print(f"{PREFIX} cannot set {name} = {value}: {exc}", file=sys.stderr)
    for name, value in written.items():
        print(f"{PREFIX} set {name.replace('/', '.')} = {value}", file=sys.stderr)
    return written


def main(argv: Sequence[str]) -> int:
    if not argv:
        print("usage: prepare_sysctls.py HOST_PROC_SYS [ipvsproxy run ARGS...]", file=sys.stderr)
        return 2
    prepare(Path(argv[0]), argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
