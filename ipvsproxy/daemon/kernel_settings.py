"""The kernel settings the daemon sets once at start: conntrack limits and IPVS timeouts.
``deploy/prepare_sysctls.py`` computes the same conntrack values with ``conntrack_sysctls``."""

from __future__ import annotations

import logging
import os

from ipvsproxy.config import ProxyConfig
from ipvsproxy.dataplane.dataplane import Backends

log = logging.getLogger("ipvsproxy")


def conntrack_sysctls(cfg: ProxyConfig, cores: int) -> dict[str, str]:
    """Upstream's conntrack settings (0 leaves the kernel's value)."""
    values: dict[str, str] = {}
    if cfg.conntrack_max_per_core > 0:
        limit = max(cfg.conntrack_max_per_core * cores, cfg.conntrack_min)
        values["net/netfilter/nf_conntrack_max"] = str(limit)
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


def apply_kernel_settings(cfg: ProxyConfig, backends: Backends) -> None:
    """Conntrack limits and IPVS timeouts, once at start; a refusal is logged, not fatal
    (in a network namespace other than the host's, nf_conntrack_max is read-only)."""
    for name, value in conntrack_sysctls(cfg, os.cpu_count() or 1).items():
        try:
            if backends.sysctls.ensure({name: value}):
                log.info("set %s = %s", name, value)
        except OSError as exc:
            log.warning("cannot set %s = %s: %s", name, value, exc)
    if cfg.tcp_timeout or cfg.tcp_fin_timeout or cfg.udp_timeout:
        try:
            backends.ipvs.set_timeouts(
                int(cfg.tcp_timeout), int(cfg.tcp_fin_timeout), int(cfg.udp_timeout)
            )
        except Exception as exc:  # ApplyError names the operation
            log.warning("cannot set IPVS timeouts: %s", exc)
