"""Which Kubernetes object each virtual and real server stands for.

The kernel knows addresses and ports only; an operator reading ``ipvsproxy status`` wants
``namespace/name:port`` and pod names. The planner records them next to what it plans, the daemon
serves them, and the state file keeps them so that ``status`` can name things while the daemon
is down. Pure values with a JSON form; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, NamedTuple

from ipvsproxy.core.virtual_servers import Protocol, ServiceKey

# Which of a Service's addresses a virtual server serves.
ROLE_CLUSTER_IP = "ClusterIP"
ROLE_EXTERNAL_IP = "ExternalIP"
ROLE_LOAD_BALANCER = "LoadBalancer"
ROLE_NODE_PORT = "NodePort"

# Which rule chose a virtual server's endpoints (core.topology): a traffic policy Local (this
# node's), Cluster without topology (all), or the topology mode the hints gave.
TOPOLOGY_LOCAL = "Local"
TOPOLOGY_CLUSTER = "Cluster"
TOPOLOGY_SAME_ZONE = "PreferSameZone"
TOPOLOGY_SAME_NODE = "PreferSameNode"


# The names are named tuples: the planner makes one per virtual server and one per endpoint
# (100,000s at a cold sync), and a tuple is built in C (a frozen dataclass's __init__ sets each
# field through object.__setattr__).


class VirtualServerIdentity(NamedTuple):
    service: str  # namespace/name
    port_name: str  # "" for an unnamed port
    port: int  # the Service port (a NodePort virtual server listens on another one)
    type: str  # the Service's spec.type
    role: str  # ROLE_*
    topology: str = ""  # TOPOLOGY_*: which rule chose its endpoints ("": unknown)

    @property
    def label(self) -> str:
        """``namespace/name:port``, the port by name when it has one, as kubectl shows it."""
        return f"{self.service}:{self.port_name or self.port}"


class EndpointIdentity(NamedTuple):
    pod: str | None  # namespace/name, from the endpoint's targetRef
    node: str | None


def _frozen(d: Mapping[Any, Any]) -> Mapping[Any, Any]:
    return MappingProxyType(dict(d))


@dataclass(frozen=True, slots=True)
class ServiceIdentity:
    """One Service's names: its virtual servers, and its endpoints by address."""

    virtual_servers: Mapping[ServiceKey, VirtualServerIdentity] = field(default_factory=dict)
    endpoints: Mapping[str, EndpointIdentity] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        virtual_servers: Mapping[ServiceKey, VirtualServerIdentity],
        endpoints: Mapping[str, EndpointIdentity],
    ) -> ServiceIdentity:
        return cls(_frozen(virtual_servers), _frozen(endpoints))

    def to_json(self) -> dict[str, Any]:
        # The protocol as its StrEnum member (equal to, and encoded as, its value: reading
        # .value is a Python-level descriptor), endpoints sorted by their unique address:
        # the state file's first snapshot renders every Service, so this is on a hot path.
        return {
            "virtualServers": sorted(
                [*k, i.port_name, i.port, i.type, i.role, i.topology]
                for k, i in self.virtual_servers.items()
            ),
            "endpoints": [[a, e.pod, e.node] for a, e in sorted(self.endpoints.items())],
        }

    @classmethod
    def from_json(cls, service: str, data: Mapping[str, Any]) -> ServiceIdentity:
        vs = dict(_vs_identity(service, row) for row in data.get("virtualServers", []))
        eps = {str(a): EndpointIdentity(pod, node) for a, pod, node in data.get("endpoints", [])}
        return cls.of(vs, eps)


def _vs_identity(service: str, row: Any) -> tuple[ServiceKey, VirtualServerIdentity]:
    # (a state file written before topology was recorded has no topology: "")
    a, p, port, name, sport, stype, role, *rest = row
    topology = str(rest[0]) if rest else ""
    key = ServiceKey(a, Protocol(p), int(port))
    return key, VirtualServerIdentity(
        service, str(name), int(sport), str(stype), str(role), topology
    )


def identities_to_json(by_service: Mapping[str, ServiceIdentity]) -> dict[str, Any]:
    return {svc: ident.to_json() for svc, ident in sorted(by_service.items())}


def identities_from_json(data: Mapping[str, Any]) -> dict[str, ServiceIdentity]:
    """Raises ValueError (or KeyError/TypeError, which callers treat alike) on a bad document."""
    return {str(svc): ServiceIdentity.from_json(str(svc), d) for svc, d in data.items()}


class Identities:
    """Lookups across every Service: by virtual server, and by endpoint address."""

    def __init__(self, by_service: Iterable[ServiceIdentity] = ()) -> None:
        self.virtual_servers: dict[ServiceKey, VirtualServerIdentity] = {}
        self.endpoints: dict[str, EndpointIdentity] = {}
        for ident in by_service:
            self.virtual_servers.update(ident.virtual_servers)
            self.endpoints.update(ident.endpoints)

    def virtual_server(self, key: ServiceKey) -> VirtualServerIdentity | None:
        return self.virtual_servers.get(key)

    def endpoint(self, address: str) -> EndpointIdentity | None:
        return self.endpoints.get(address)
