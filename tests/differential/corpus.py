"""The Service shapes both proxies are given: one per Service feature the README claims.

A shape is a Service (its manifest, and the load-balancer status a cloud controller would
write) and its own Pod objects. Each Pod borrows the address of a lab pod (``pod-I-J``, whose
echo server answers with that name), so two shapes' Pods may share an address but never a
state: a readiness flip or a deletion in one shape changes no other shape. Pods are symmetric
between node-2 and node-3 (the two proxied nodes), so "with a local endpoint" holds on both or
on neither; node-1 runs no proxy and only serves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

NAMESPACE = "diff"
ECHO_PORT = 8080
PROXY_NAME_LABEL = "service.kubernetes.io/service-proxy-name"
ZONE_LABEL = "topology.kubernetes.io/zone"


def zone(node: int) -> str:
    """Every lab node is a zone of its own: what the controller hints for the symmetric
    pods of node-2 and node-3 is symmetric too."""
    return f"zone-{node}"


@dataclass(frozen=True)
class PodSpec:
    node: int  # lab node index (1..3)
    index: int  # lab pod index on that node (1..2)
    ready: bool = True
    terminating: bool = False

    def lab_pod(self) -> str:
        return f"pod-{self.node}-{self.index}"


ALL = tuple(PodSpec(n, j) for n in (1, 2, 3) for j in (1, 2))
REMOTE = tuple(PodSpec(1, j) for j in (1, 2))  # no endpoint on either proxied node


@dataclass(frozen=True)
class Shape:
    name: str
    spec: dict[str, Any]
    pods: tuple[PodSpec, ...] = ALL
    ingress: tuple[dict[str, str], ...] = ()  # status.loadBalancer.ingress
    labels: dict[str, str] = field(default_factory=dict)
    note: str = ""

    def manifest(self) -> dict[str, Any]:
        spec = dict(self.spec)
        if spec.get("type") != "ExternalName":
            spec.setdefault("selector", {"shape": self.name})
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": self.name, "namespace": NAMESPACE, "labels": dict(self.labels)},
            "spec": spec,
        }

    @property
    def families(self) -> tuple[str, ...]:
        """The IP families its cluster IPs are of (the lab's cluster is IPv4-primary)."""
        if self.spec.get("ipFamilyPolicy") == "RequireDualStack":
            return ("IPv4", "IPv6")
        return tuple(self.spec.get("ipFamilies") or ["IPv4"])

    def pod_name(self, pod: PodSpec) -> str:
        return f"{self.name}-{pod.node}-{pod.index}"


def port(
    number: int, name: str = "", protocol: str = "TCP", target: int | str = ECHO_PORT
) -> dict[str, Any]:
    p: dict[str, Any] = {"port": number, "protocol": protocol, "targetPort": target}
    if name:
        p["name"] = name
    return p


HTTP = (port(80),)


def lb(*ingress: str, proxy: bool = False) -> tuple[dict[str, str], ...]:
    mode = {"ipMode": "Proxy"} if proxy else {}
    return tuple({"ip": ip, **mode} for ip in ingress)


SHAPES: tuple[Shape, ...] = (
    Shape("cluster-ip", {"ports": list(HTTP)}),
    Shape(
        "multi-port",
        {
            "ports": [
                port(80, "web", target="echo"),
                port(8081, "alt"),
                port(53, "dns", "UDP", target="echo-udp"),
            ]
        },
        note="named, numeric and mixed-protocol ports",
    ),
    Shape("sctp", {"type": "NodePort", "ports": [port(90, "sctp", "SCTP")]}),
    Shape("node-port", {"type": "NodePort", "ports": [port(80, "tcp"), port(53, "udp", "UDP")]}),
    Shape(
        "load-balancer", {"type": "LoadBalancer", "ports": list(HTTP)}, ingress=lb("203.0.113.10")
    ),
    Shape(
        "lb-ranges-external",
        {
            "type": "LoadBalancer",
            "ports": list(HTTP),
            "loadBalancerSourceRanges": ["192.168.56.100/32"],
        },
        ingress=lb("203.0.113.11"),
        note="only the external client is in range",
    ),
    Shape(
        "lb-ranges-pods",
        {
            "type": "LoadBalancer",
            "ports": list(HTTP),
            "loadBalancerSourceRanges": ["10.244.0.0/16"],
        },
        ingress=lb("203.0.113.12"),
        note="only pods are in range",
    ),
    Shape(
        "lb-ip-mode-proxy",
        {"type": "LoadBalancer", "ports": list(HTTP)},
        ingress=lb("203.0.113.13", proxy=True),
    ),
    Shape("external-ips", {"ports": list(HTTP), "externalIPs": ["192.0.2.10"]}),
    Shape(
        "etp-local",
        {
            "type": "LoadBalancer",
            "ports": list(HTTP),
            "externalIPs": ["192.0.2.11"],
            "externalTrafficPolicy": "Local",
        },
        ingress=lb("203.0.113.14"),
    ),
    Shape(
        "etp-local-none",
        {
            "type": "LoadBalancer",
            "ports": list(HTTP),
            "externalIPs": ["192.0.2.12"],
            "externalTrafficPolicy": "Local",
        },
        pods=REMOTE,
        ingress=lb("203.0.113.15"),
    ),
    Shape(
        "etp-local-terminating",
        {"type": "LoadBalancer", "ports": list(HTTP), "externalTrafficPolicy": "Local"},
        pods=(
            *REMOTE,
            PodSpec(2, 1, terminating=True),
            PodSpec(3, 1, terminating=True),
        ),
        ingress=lb("203.0.113.16"),
        note="the local endpoint is serving but terminating, the remote ones ready",
    ),
    Shape("itp-local", {"ports": list(HTTP), "internalTrafficPolicy": "Local"}),
    Shape("itp-local-none", {"ports": list(HTTP), "internalTrafficPolicy": "Local"}, pods=REMOTE),
    Shape(
        "affinity",
        {
            "type": "NodePort",
            "ports": list(HTTP),
            "sessionAffinity": "ClientIP",
            # Not the default (10800), and longer than the test: an affinity that expired
            # between two of a probe's requests would show a second pod by timing alone.
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 3600}},
        },
        pods=REMOTE,
        note="remote endpoints only: which one a client sticks to is the scheduler's choice, "
        "the client address it sees is the same for either",
    ),
    Shape(
        "not-ready",
        {"ports": list(HTTP)},
        pods=tuple(PodSpec(n, j, ready=j == 1) for n in (1, 2, 3) for j in (1, 2)),
    ),
    Shape(
        "terminating",
        {"ports": list(HTTP)},
        pods=tuple(PodSpec(n, j, terminating=j == 2) for n in (1, 2, 3) for j in (1, 2)),
        note="ready endpoints beside serving-terminating ones",
    ),
    Shape(
        "all-terminating",
        {"ports": list(HTTP)},
        pods=tuple(
            PodSpec(n, j, ready=j == 1, terminating=True) for n in (1, 2, 3) for j in (1, 2)
        ),
        note="only terminating endpoints: the serving ones are used",
    ),
    Shape(
        "prefer-same-zone",
        {"type": "NodePort", "ports": list(HTTP), "trafficDistribution": "PreferSameZone"},
        note="the controller hints each endpoint for its node's zone",
    ),
    Shape(
        "prefer-same-node",
        {"ports": list(HTTP), "trafficDistribution": "PreferSameNode"},
        note="node and zone hints",
    ),
    Shape(
        "prefer-same-zone-remote",
        {"ports": list(HTTP), "trafficDistribution": "PreferSameZone"},
        pods=REMOTE,
        note="no endpoint hinted for either compared node's zone: every endpoint is used",
    ),
    Shape(
        "prefer-same-zone-itp-local",
        {
            "ports": list(HTTP),
            "trafficDistribution": "PreferSameZone",
            "internalTrafficPolicy": "Local",
        },
        note="a traffic policy Local ignores topology",
    ),
    Shape(
        "ipv6",
        {
            "type": "NodePort",
            "ipFamilies": ["IPv6"],
            "ipFamilyPolicy": "SingleStack",
            "ports": [port(80, "tcp"), port(53, "udp", "UDP")],
        },
        note="IPv6 only: its cluster IP and NodePorts",
    ),
    Shape(
        "dual-stack",
        {"type": "NodePort", "ipFamilyPolicy": "RequireDualStack", "ports": list(HTTP)},
        note="a cluster IP and NodePorts of each family",
    ),
    Shape(
        "dual-stack-etp-local",
        {
            "type": "NodePort",
            "ipFamilyPolicy": "RequireDualStack",
            "externalTrafficPolicy": "Local",
            "ports": list(HTTP),
        },
    ),
    Shape(
        "ipv6-affinity",
        {
            "ipFamilies": ["IPv6"],
            "ipFamilyPolicy": "SingleStack",
            "ports": list(HTTP),
            "sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 3600}},
        },
        pods=REMOTE,
    ),
    Shape("no-endpoints", {"type": "NodePort", "ports": list(HTTP)}, pods=()),
    Shape("proxy-name", {"ports": list(HTTP)}, labels={PROXY_NAME_LABEL: "other-proxy"}),
    Shape("headless", {"clusterIP": "None", "ports": list(HTTP)}),
    Shape("external-name", {"type": "ExternalName", "externalName": "example.com"}, pods=()),
)


def shape(name: str) -> Shape:
    for s in SHAPES:
        if s.name == name:
            return s
    raise KeyError(name)


def names(shapes: Sequence[Shape] = SHAPES) -> list[str]:
    return [s.name for s in shapes]
