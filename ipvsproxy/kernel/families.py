"""Which IP families this node's kernel can serve (upstream runs an IPv6 proxier where
ip6tables works, beside the IPv4 one)."""

from __future__ import annotations

import subprocess
from pathlib import Path

IF_INET6 = Path("/proc/net/if_inet6")
DISABLE_IPV6 = Path("/proc/sys/net/ipv6/conf/all/disable_ipv6")


def ipv6_unavailable(
    ip6tables_save: str = "ip6tables-save",
    if_inet6: Path = IF_INET6,
    disable_ipv6: Path = DISABLE_IPV6,
) -> str | None:
    """Why this node cannot serve IPv6 Services; None when it can: the kernel has IPv6, it is
    not disabled, and ip6tables' nat table can be read."""
    if not if_inet6.exists():
        return f"the kernel has no IPv6 ({if_inet6} is missing)"
    try:
        if disable_ipv6.read_text().strip() == "1":
            return "IPv6 is disabled (net.ipv6.conf.all.disable_ipv6 = 1)"
    except OSError:
        pass  # not readable here: ip6tables decides
    try:
        proc = subprocess.run(
            [ip6tables_save, "-t", "nat"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{ip6tables_save} -t nat cannot run: {exc}"
    if proc.returncode != 0:
        return f"{ip6tables_save} -t nat failed: {proc.stderr.strip() or proc.returncode}"
    return None
