"""Health-check targets: what each externalTrafficPolicy Local Service's healthCheckNodePort
answers on this node (upstream's ServiceHealthServer input)."""

from __future__ import annotations

from collections.abc import Mapping

from ipvsproxy.kube.informer import Kept
from ipvsproxy.servers.service_health import Target


def health_check_targets(
    services: Mapping[str, Kept], slices: Mapping[str, Mapping[str, Kept]], node: str
) -> dict[int, Target]:
    """healthCheckNodePort -> its Service and its local endpoints' count (the distinct first
    addresses of its endpoints on ``node`` that are not unready), for every eTP=Local Service
    that has one. ``slices``: service key -> slice key -> EndpointSlice."""
    wanted: dict[int, Target] = {}
    for key, svc in services.items():
        spec = svc.get("spec") or {}
        port = int(spec.get("healthCheckNodePort") or 0)
        if not port or spec.get("externalTrafficPolicy") != "Local":
            continue
        local = {
            addr
            for sl in slices.get(key, {}).values()
            for ep in sl.get("endpoints") or []
            if ep.get("nodeName") == node
            and (ep.get("conditions") or {}).get("ready", True) is not False
            for addr in (ep.get("addresses") or [])[:1]
        }
        wanted[port] = Target(key, len(local))
    return wanted
