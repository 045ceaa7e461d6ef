"""The process's resource limits."""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("ipvsproxy")


def raise_open_files_limit() -> None:
    """The soft RLIMIT_NOFILE raised to the hard one, as Go's runtime does at start for
    upstream's kube-proxy: containerd 2.x and Docker 29 start a container at a soft 1,024,
    which every watch, listening socket, connection and iptables-restore pipe shares. Only
    epoll and poll wait on descriptors here (select() cannot take those past 1,023). A refusal
    is logged; the daemon runs with the limit it has."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (OSError, ValueError) as exc:
        log.warning("cannot raise the open files limit from %d to %d: %s", soft, hard, exc)
        return
    log.info("open files limit raised from %d to %d (the hard limit)", soft, hard)
