"""Which endpoints a service port's traffic goes to: upstream kube-proxy's
``CategorizeEndpoints`` (pkg/proxy/topology.go), with PreferSameTrafficDistribution on (GA).

Cluster traffic goes to the ready endpoints the topology mode keeps; when none is ready
anywhere, to the serving ones that are terminating, topology ignored. The mode comes from the
EndpointSlices' hints only (the EndpointSlice controller writes them from
``spec.trafficDistribution``; the proxy never reads that field):

- ``PreferSameNode`` when every ready endpoint has node hints and one is for this node;
- else ``PreferSameZone`` when every ready endpoint has zone hints and one is for this node's
  zone (its ``topology.kubernetes.io/zone`` label);
- else none: every ready endpoint.

Local traffic (a traffic policy Local) goes to this node's ready endpoints, else to its serving
terminating ones; topology plays no part.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

ZONE_LABEL = "topology.kubernetes.io/zone"
SAME_NODE = "PreferSameNode"
SAME_ZONE = "PreferSameZone"
NO_TOPOLOGY = ""


class Hints(NamedTuple):
    """An endpoint's hints: the zones and the nodes it is meant for."""

    zones: frozenset[str]
    nodes: frozenset[str]


class Categorizable(Protocol):
    @property
    def ready(self) -> bool: ...
    @property
    def serving(self) -> bool: ...
    @property
    def terminating(self) -> bool: ...
    @property
    def node(self) -> str | None: ...
    @property
    def hints(self) -> Hints | None: ...


E = TypeVar("E", bound=Categorizable)


def _names(entries: Any) -> frozenset[str]:
    """The names of ``forZones`` or ``forNodes`` entries; malformed ones are left out (the API
    server validates hints, so only a broken writer sends them)."""
    if not isinstance(entries, list):
        return frozenset()
    return frozenset(
        e["name"] for e in entries if isinstance(e, Mapping) and isinstance(e.get("name"), str)
    )


def hints_of(value: Any) -> Hints | None:
    """An endpoint's ``hints`` field as Hints; None when it has none."""
    if not value or not isinstance(value, Mapping):
        return None
    hints = Hints(_names(value.get("forZones")), _names(value.get("forNodes")))
    return hints if hints.zones or hints.nodes else None


def zone_of(node: Mapping[str, Any] | None) -> str:
    """A Node's zone label ("": none)."""
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    zone = labels.get(ZONE_LABEL) if isinstance(labels, Mapping) else None
    return zone if isinstance(zone, str) else ""


def reads_zone(slices: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a Service's plan reads the node's zone: one of its endpoints has zone hints.
    Others need no re-plan when the zone changes."""
    for sl in slices:
        for ep in sl.get("endpoints") or ():
            h = hints_of(ep.get("hints")) if hasattr(ep, "get") else None
            if h is not None and h.zones:
                return True
    return False


def topology_mode(endpoints: Sequence[E], node: str, zone: str) -> str:
    """Upstream's topologyModeFromHints: SAME_NODE, SAME_ZONE or NO_TOPOLOGY."""
    all_node_hints = all_zone_hints = True
    for_node = for_zone = False
    for e in endpoints:
        if not e.ready:
            continue
        h = e.hints
        if h is None or not h.zones:
            all_zone_hints = False
        elif zone in h.zones:
            for_zone = True
        if h is None or not h.nodes:
            all_node_hints = False
        elif node in h.nodes:
            for_node = True
    if all_node_hints and for_node:
        return SAME_NODE
    if all_zone_hints and for_zone:
        return SAME_ZONE
    return NO_TOPOLOGY


def _for_topology(e: Categorizable, mode: str, node: str, zone: str) -> bool:
    h = e.hints
    if mode == SAME_NODE:
        return h is not None and node in h.nodes
    if mode == SAME_ZONE:
        return h is not None and zone in h.zones
    return True


def cluster_endpoints(endpoints: Sequence[E], node: str, zone: str) -> tuple[list[E], str]:
    """The endpoints cluster traffic goes to, and the topology mode that chose them."""
    mode = NO_TOPOLOGY
    if any(e.hints is not None for e in endpoints):
        mode = topology_mode(endpoints, node, zone)
    if mode == NO_TOPOLOGY:  # (most Services: one pass, no call per endpoint)
        chosen = [e for e in endpoints if e.ready]
    else:
        chosen = [e for e in endpoints if e.ready and _for_topology(e, mode, node, zone)]
    if chosen:
        return chosen, mode
    # No ready endpoint anywhere (the mode needs one): serving terminating ones, any topology.
    return [e for e in endpoints if e.serving and e.terminating], NO_TOPOLOGY


def local_endpoints(endpoints: Sequence[E], node: str) -> list[E]:
    """The endpoints local traffic goes to: this node's ready ones, else its serving
    terminating ones."""
    mine = [e for e in endpoints if e.node == node]
    ready = [e for e in mine if e.ready]
    return ready or [e for e in mine if e.serving and e.terminating]
