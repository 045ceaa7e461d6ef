"""Writes the kernel settings ipvsproxy needs through the host's /proc/sys/net, before it starts.

Usage (from entrypoint.sh): ``python3 prepare_sysctls.py HOST_PROC_SYS [ipvsproxy run ARGS...]``

Why this exists: ipvsproxy sets ``net.ipv4.vs.conntrack``, ``expire_nodest_conn``,
``expire_quiescent_template``, ``ip_forward`` (and ``conn_reuse_mode``, ``arp_ignore``/
``arp_announce`` where they apply) on every full sync, and the conntrack limits at start,
through ``/proc/sys``. Container runtimes mount ``/proc/sys`` read-only in any container that
is not privileged, whatever its capabilities, so those writes would fail there and every full
sync with them. The DaemonSet mounts the host's ``/proc/sys/net`` read-write at
``HOST_PROC_SYS/net`` instead (as Cilium's agent does); this script writes the very values
ipvsproxy would, computed by ipvsproxy's own functions from the same arguments. ipvsproxy then
reads them back from ``/proc/sys``, finds them set, and writes nothing.

It never stops the start: an invalid configuration is left for ipvsproxy to report (it names
the field), and a setting that cannot be written is printed and left for ipvsproxy to retry
(it reports the failure in its own log and metrics).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ipvsproxy import config
from ipvsproxy.daemon.kernel_settings import conntrack_sysctls
from ipvsproxy.kernel.sysctl import Sysctls, required

PREFIX = "ipvsproxy-entrypoint:"


def wanted(
    cfg: config.ProxyConfig, cores: int, kernel_release: str | None = None
) -> dict[str, str]:
    """Every setting ipvsproxy writes for ``cfg``: the IPVS ones each sync, the conntrack ones
    at start. The same functions ipvsproxy calls, so the two cannot drift apart."""
    return {**required(cfg.strict_arp, kernel_release), **conntrack_sysctls(cfg, cores)}


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
    written: dict[str, str] = {}
    for name, value in wanted(cfg, cores or os.cpu_count() or 1, kernel_release).items():
        if not name.startswith("net/"):  # only net/ is mounted from the host
            print(f"{PREFIX} {name} is not under net/, left to ipvsproxy", file=sys.stderr)
            continue
        try:
            if sysctls.ensure({name: value}):
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
