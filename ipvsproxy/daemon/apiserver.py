"""The API server's addresses as the daemon reaches it: no Service may take one as an
externalIP or load-balancer IP (bound on kube-ipvs0 it would cut the node off from the API)."""

from __future__ import annotations

import logging
import socket
from urllib.parse import urlsplit

from ipvsproxy.core.virtual_servers import canonical_ip

log = logging.getLogger("ipvsproxy")


def api_server_addresses(url: str) -> frozenset[str]:
    """The addresses of the API server as the daemon reaches it (``url``: its client's
    host): the address itself, or what its name resolves to now (none when it does not);
    no Service may take one as an externalIP or load-balancer IP."""
    host = urlsplit(url).hostname if "//" in url else url
    if not host:
        return frozenset()
    try:
        return frozenset({canonical_ip(host)})
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as exc:
        log.info("API server %s does not resolve (%s): no address reserved for it", host, exc)
        return frozenset()
    return frozenset(canonical_ip(str(info[4][0]).partition("%")[0]) for info in found)
