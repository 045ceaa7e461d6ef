"""The kernel settings the daemon sets once at start, in upstream's order: the conntrack limits
and timeouts (kube-proxy's platformSetup), the sysctls IPVS needs (its NewProxier), the IPVS
timeouts. ``deploy/prepare_sysctls.py`` computes the same values with these functions."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from functools import partial

from ipvsproxy.config import ProxyConfig
from ipvsproxy.dataplane.dataplane import Backends
from ipvsproxy.kernel.interfaces import SysctlBackend
from ipvsproxy.kernel.sysctl import HASHSIZE, required

log = logging.getLogger("ipvsproxy")

CONNTRACK_MAX = "net/netfilter/nf_conntrack_max"
# Upstream's cap on maxPerCore x CPUs (getConntrackMax), against excessive memory use on
# nodes with many CPUs. conntrack.min is not capped.
CONNTRACK_MAX_LIMIT = 1048576


class KernelSettingsError(RuntimeError):
    """A setting the daemon needs that cannot be set: it exits with this reason, as
    upstream does."""


def conntrack_max(cfg: ProxyConfig, cores: int) -> int:
    """Upstream's nf_conntrack_max for ``cores`` CPUs (0: the kernel's is left alone)."""
    if cfg.conntrack_max_per_core <= 0:
        return 0
    scaled = cfg.conntrack_max_per_core * cores
    if scaled > CONNTRACK_MAX_LIMIT:
        return CONNTRACK_MAX_LIMIT
    return max(scaled, cfg.conntrack_min)


def conntrack_floors(cfg: ProxyConfig, cores: int) -> dict[str, int]:
    """The conntrack limits upstream only ever raises, in its order: nf_conntrack_max, then
    the hash size to a quarter of it."""
    limit = conntrack_max(cfg, cores)
    return {CONNTRACK_MAX: limit, HASHSIZE: limit // 4} if limit else {}


def conntrack_sysctls(cfg: ProxyConfig) -> dict[str, str]:
    """Upstream's conntrack timeouts (0 leaves the kernel's value), written when they differ."""
    values: dict[str, str] = {}
    for name, seconds in (
        (
            "net/netfilter/nf_conntrack_tcp_timeout_established",
            cfg.conntrack_tcp_established_timeout,
        ),
        ("net/netfilter/nf_conntrack_tcp_timeout_close_wait", cfg.conntrack_tcp_close_wait_timeout),
        ("net/netfilter/nf_conntrack_udp_timeout", cfg.conntrack_udp_timeout),
        ("net/netfilter/nf_conntrack_udp_timeout_stream", cfg.conntrack_udp_stream_timeout),
    ):
        if seconds > 0:
            values[name] = str(int(seconds))
    if cfg.conntrack_tcp_be_liberal:  # upstream only ever sets it, never back to 0
        values["net/netfilter/nf_conntrack_tcp_be_liberal"] = "1"
    return values


def _hash_size_left(sysctls: SysctlBackend, wanted: str) -> None:
    """A hash size below its floor on a read-only /sys (this pod is not privileged): left as
    it is, with a warning. Lookups in a small table are slower; a proxy that exits serves
    nothing."""
    try:
        current = sysctls.read({HASHSIZE: wanted})[HASHSIZE]
    except OSError:
        current = "unknown"
    log.warning(
        "conntrack hash size %s is %s, below %s (a quarter of nf_conntrack_max), and /sys is "
        'read-only here: left as it is; raise it on the node (deploy/README.md, "Sysctls")',
        HASHSIZE,
        current,
        wanted,
    )


def apply_kernel_settings(cfg: ProxyConfig, backends: Backends) -> None:
    """Set what the daemon needs, once at start. A conntrack limit or timeout, or a sysctl
    IPVS needs, that cannot be set raises KernelSettingsError naming it and why (upstream
    exits), but for the hash size on a read-only /sys (warned, see ``_hash_size_left``); IPVS
    timeouts that cannot be set are logged only (as upstream)."""
    sysctls, cores = backends.sysctls, os.cpu_count() or 1
    steps: list[tuple[str, str, Callable[[], list[str]]]] = [
        (name, str(floor), partial(sysctls.raise_to, {name: floor}))
        for name, floor in conntrack_floors(cfg, cores).items()
    ]
    steps += [
        (name, value, partial(sysctls.ensure, {name: value}))
        for name, value in conntrack_sysctls(cfg).items()
    ]
    conntrack = len(steps)
    steps += [
        (name, value, partial(sysctls.ensure, {name: value}))
        for name, value in required(cfg.strict_arp).items()
    ]
    for i, (name, value, write) in enumerate(steps):
        try:
            if write():
                log.info("set %s = %s", name, value)
        except OSError as exc:
            if name == HASHSIZE and exc.errno == errno.EROFS:
                _hash_size_left(sysctls, value)
                continue
            why = f"can't set sysctl {name} to {value}: {exc}"
            if i < conntrack:
                why = f"could not set conntrack parameters from kube-proxy configuration: {why}"
            raise KernelSettingsError(why) from exc
    if cfg.tcp_timeout or cfg.tcp_fin_timeout or cfg.udp_timeout:
        try:
            backends.ipvs.set_timeouts(
                int(cfg.tcp_timeout), int(cfg.tcp_fin_timeout), int(cfg.udp_timeout)
            )
        except Exception as exc:  # ApplyError names the operation
            log.warning("cannot set IPVS timeouts: %s", exc)
