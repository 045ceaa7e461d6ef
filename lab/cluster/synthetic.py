"""A deterministic synthetic cluster: Services and EndpointSlices shaped as the API sends them.

``cluster(S, E, seed)`` returns S Services, each with one EndpointSlice of E ready endpoints, as
``("namespace/name", service, [slice])`` in index order. Everything about Service ``i`` follows
from ``(i, E, seed)`` alone (``service_at``), so a cluster is the same in every run.

The mix, by index (exact when S is a multiple of 20):

* ``i % 20`` in 0..15: ClusterIP (80%); 16..18: NodePort (15%); 19: LoadBalancer (5%), with one
  ingress IP in ``status.loadBalancer.ingress`` (from 172.16.0.0/12, one per LoadBalancer).
* 1 to 3 ports (2 on average), drawn from common port numbers without repeats; about one port
  in 12 is UDP, the rest TCP. Each port targets ``10000 + port`` on its endpoints.
* Cluster IPs are 10.96.0.16 + i, unique in 10.96.0.0/12 (up to ~1,000,000 Services).

Node ports. 30000-32767 holds 2,768 ports, and 20% of Services are NodePort or LoadBalancer
with 2 ports on average: allocating every port would run out near S = 7,000. The rule here:
**only the first port of a NodePort or LoadBalancer Service has a nodePort**, numbered in index
order from 30000 (the API server would give every port one; the planner treats a missing
nodePort as none, so later ports are served on their cluster IP only). That is 4 node ports per
20 Services: 2,000 at S = 10,000, and the range lasts to S = 13,840. Beyond that ``service_at``
raises ValueError rather than wrapping around (a real API server refuses such a Service too).

Endpoints. Endpoint ``j`` of Service ``i`` is pod ``n = i * E + j``: host (n mod 65,024) of
10.244.0.0/16 counting only .1-.254 of each /24 (a node's pod CIDR: no network or broadcast
address, which the kernel refuses as a real server where a node's bridge holds that /24), on
node ``node-{n mod 10 + 1}``, with nodeName and a Pod targetRef named after its address. The
/16 holds 65,024 such pods, fewer than the 100,000
endpoints of 10,000 x 10: beyond that, pods are reused by later Services (as when several
Services select the same Pods); within one Service every address is distinct. One slice holds
all E endpoints (the EndpointSlice controller would split at 100; this planner merges slices
anyway).

Ten nodes, not the lab's three: a node holds the KUBE-LOOP-BACK member of each local endpoint
and port, and ipsets hold at most 65,536 members (upstream's maxelem, the ipset default). With
three nodes, node-1's share of 10,000 x 10 was 66,316 members: the kernel refuses such a set,
so no proxy could program that cluster on that node. With ten it is about 20,000 (a real
cluster of 10,000 Services has hundreds of nodes, each with far fewer).

``dual_stack(entry)`` makes any Service of these dual-stack, with an IPv6 slice beside each
IPv4 one (the same pods at ``pod_ip6``), for the benchmark of dual-stack's cost.

Changes for the one-change measurements return new slice lists and leave their input alone:
``with_endpoint_added``, ``with_endpoint_removed``, ``with_endpoint_not_ready``; and
``new_service(cluster)`` is the Service that would come next.
"""

from __future__ import annotations

import copy
import ipaddress
import random
import uuid
from typing import Any

NAMESPACE = "bench"
NODES = tuple(f"node-{i}" for i in range(1, 11))
CLUSTER_IP_BASE = int(ipaddress.IPv4Address("10.96.0.16"))
CLUSTER_IP_LIMIT = int(ipaddress.IPv4Address("10.111.255.254"))  # last host of 10.96.0.0/12
POD_BASE = int(ipaddress.IPv4Address("10.244.0.1"))
HOSTS_PER_NODE_SUBNET = 254  # .1 .. .254 of a /24
POD_ADDRESSES = 256 * HOSTS_PER_NODE_SUBNET  # 65,024
LB_BASE = int(ipaddress.IPv4Address("172.16.0.1"))
NODE_PORT_FIRST = 30000
NODE_PORT_LAST = 32767
COMMON_PORTS = (80, 443, 8080, 8443, 9090, 9100, 3306, 5432, 6379, 53)
UDP_SHARE = 1 / 12

ServiceEntry = tuple[str, dict[str, Any], list[dict[str, Any]]]

_UID_NAMESPACE = uuid.UUID("6f1f3c6e-0b53-4f6e-9d2e-6c1f2b7e4a10")


def service_type(index: int) -> str:
    r = index % 20
    if r < 16:
        return "ClusterIP"
    return "NodePort" if r < 19 else "LoadBalancer"


def node_port_ordinal(index: int) -> int | None:
    """How many Services before ``index`` have a node port (None: this one has none)."""
    r = index % 20
    if r < 16:
        return None
    return (index // 20) * 4 + (r - 16)


def load_balancer_ordinal(index: int) -> int | None:
    return index // 20 if index % 20 == 19 else None


def cluster_ip(index: int) -> str:
    value = CLUSTER_IP_BASE + index
    if value > CLUSTER_IP_LIMIT:
        raise ValueError(f"service {index}: 10.96.0.0/12 has no cluster IP left")
    return str(ipaddress.IPv4Address(value))


def pod_ip(n: int) -> str:
    """Pod ``n``'s address: host ``.1``-``.254`` of a /24 of 10.244.0.0/16, as a node's pod
    CIDR hands them out (never a /24's network or broadcast address)."""
    subnet, host = divmod(n % POD_ADDRESSES, HOSTS_PER_NODE_SUBNET)
    return str(ipaddress.IPv4Address(POD_BASE + subnet * 256 + host))


def _uid(*parts: object) -> str:
    return str(uuid.uuid5(_UID_NAMESPACE, "/".join(str(p) for p in parts)))


def _name(index: int) -> str:
    return f"svc-{index:05d}"


def _pod_ref(address: str) -> dict[str, Any]:
    name = "pod-" + address.replace(".", "-")
    return {"kind": "Pod", "namespace": NAMESPACE, "name": name, "uid": _uid("pod", address)}


def _endpoint(address: str, node: str) -> dict[str, Any]:
    return {
        "addresses": [address],
        "conditions": {"ready": True, "serving": True, "terminating": False},
        "nodeName": node,
        "targetRef": _pod_ref(address),
    }


def service_at(index: int, endpoints: int, seed: int = 0) -> ServiceEntry:
    """Service ``index`` of every synthetic cluster with this ``endpoints`` and ``seed``."""
    rng = random.Random(f"ipvsproxy-bench/{seed}/{index}")
    name = _name(index)
    stype = service_type(index)
    count = rng.choice((1, 2, 3))
    numbers = rng.sample(COMMON_PORTS, count)
    ports: list[dict[str, Any]] = []
    slice_ports: list[dict[str, Any]] = []
    for k, number in enumerate(numbers):
        protocol = "UDP" if rng.random() < UDP_SHARE else "TCP"
        port_name = f"{protocol.lower()}-{number}"
        port: dict[str, Any] = {
            "name": port_name,
            "protocol": protocol,
            "port": number,
            "targetPort": 10000 + number,
        }
        ordinal = node_port_ordinal(index)
        if ordinal is not None and k == 0:
            node_port = NODE_PORT_FIRST + ordinal
            if node_port > NODE_PORT_LAST:
                raise ValueError(
                    f"service {index}: node ports {NODE_PORT_FIRST}-{NODE_PORT_LAST} exhausted"
                )
            port["nodePort"] = node_port
        ports.append(port)
        slice_ports.append({"name": port_name, "protocol": protocol, "port": 10000 + number})

    ip = cluster_ip(index)
    spec: dict[str, Any] = {
        "type": stype,
        "clusterIP": ip,
        "clusterIPs": [ip],
        "ipFamilies": ["IPv4"],
        "ipFamilyPolicy": "SingleStack",
        "internalTrafficPolicy": "Cluster",
        "sessionAffinity": "None",
        "selector": {"app": name},
        "ports": ports,
    }
    status: dict[str, Any] = {"loadBalancer": {}}
    if stype != "ClusterIP":
        spec["externalTrafficPolicy"] = "Cluster"
    lb = load_balancer_ordinal(index)
    if lb is not None:
        spec["allocateLoadBalancerNodePorts"] = True
        ingress = str(ipaddress.IPv4Address(LB_BASE + lb))
        status = {"loadBalancer": {"ingress": [{"ip": ingress, "ipMode": "VIP"}]}}
    svc_uid = _uid("service", seed, index)
    svc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "uid": svc_uid,
            "resourceVersion": str(1000 + 2 * index),
            "creationTimestamp": "2024-01-01T00:00:00Z",
            "labels": {"app": name},
        },
        "spec": spec,
        "status": status,
    }

    eps = []
    for j in range(endpoints):
        n = index * endpoints + j
        eps.append(_endpoint(pod_ip(n), NODES[n % len(NODES)]))
    sl: dict[str, Any] = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{name}-{_uid('slice', seed, index)[:5]}",
            "generateName": f"{name}-",
            "namespace": NAMESPACE,
            "uid": _uid("slice", seed, index),
            "resourceVersion": str(1001 + 2 * index),
            "labels": {
                "kubernetes.io/service-name": name,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "name": name,
                    "uid": svc_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": slice_ports,
    }
    return f"{NAMESPACE}/{name}", svc, [sl]


def cluster(services: int, endpoints: int, seed: int = 0) -> list[ServiceEntry]:
    """``services`` Services with ``endpoints`` ready endpoints each (see the module's rules)."""
    return [service_at(i, endpoints, seed) for i in range(services)]


def new_service(cluster: list[ServiceEntry], seed: int = 0) -> ServiceEntry:
    """The Service that ``cluster`` (made with this ``seed``) does not hold yet: the next index,
    with as many endpoints as the cluster's first Service."""
    endpoints = 0
    if cluster:
        endpoints = sum(len(sl.get("endpoints") or []) for sl in cluster[0][2])
    return service_at(len(cluster), endpoints, seed)


CLUSTER_IP6_BASE = int(ipaddress.IPv6Address("fd00:10:96::10"))  # in kind's fd00:10:96::/112
LB6_BASE = int(ipaddress.IPv6Address("fd00:172:16::1"))


def pod_ip6(ip: str) -> str:
    """The IPv6 address of the pod whose IPv4 one is ``ip``: 10.244.S.H -> fd00:10:244:S::H
    (the lab's pod CIDRs, fd00:10:244:N::/64 beside 10.244.N.0/24)."""
    _, _, subnet, host = ip.split(".")
    return str(ipaddress.IPv6Address(f"fd00:10:244:{int(subnet):x}::{int(host):x}"))


def _slice6(sl: dict[str, Any]) -> dict[str, Any]:
    """The IPv6 slice the EndpointSlice controller writes beside IPv4 slice ``sl``."""
    out = copy.deepcopy(sl)
    meta = out["metadata"]
    meta["name"] = meta["name"] + "-v6"
    meta["uid"] = _uid("slice6", meta["uid"])
    out["addressType"] = "IPv6"
    for ep in out.get("endpoints") or []:
        ep["addresses"] = [pod_ip6(a) for a in ep["addresses"]]
    return out


def dual_stack(entry: ServiceEntry) -> ServiceEntry:
    """Synthetic Service ``entry`` as a dual-stack one (RequireDualStack, IPv4 first): an IPv6
    cluster IP (fd00:10:96::10 + its index), an IPv6 load-balancer ingress beside the IPv4 one,
    and beside each IPv4 slice an IPv6 one with the same pods (``pod_ip6``). Changes made with
    ``with_endpoint_*`` to the IPv4 slices carry over: apply them first, then this."""
    key, svc, slices = entry
    svc = copy.deepcopy(svc)
    spec = svc["spec"]
    index = int(ipaddress.IPv4Address(spec["clusterIP"])) - CLUSTER_IP_BASE
    spec["clusterIPs"] = [spec["clusterIP"], str(ipaddress.IPv6Address(CLUSTER_IP6_BASE + index))]
    spec["ipFamilies"] = ["IPv4", "IPv6"]
    spec["ipFamilyPolicy"] = "RequireDualStack"
    lb = load_balancer_ordinal(index)
    if lb is not None:
        ingress = svc["status"]["loadBalancer"]["ingress"]
        ingress.append({"ip": str(ipaddress.IPv6Address(LB6_BASE + lb)), "ipMode": "VIP"})
    v4 = [sl for sl in slices if sl.get("addressType") == "IPv4"]
    return key, svc, [*v4, *(_slice6(sl) for sl in v4)]


def _changed(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = copy.deepcopy(slices)
    for sl in out:
        meta = sl.setdefault("metadata", {})
        meta["resourceVersion"] = str(int(meta.get("resourceVersion") or 0) + 1)
    return out


def with_endpoint_added(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One more ready endpoint: the highest pod address the Service does not use yet."""
    out = _changed(slices)
    used = {a for sl in out for ep in sl.get("endpoints") or [] for a in ep.get("addresses", [])}
    n = POD_ADDRESSES - 1
    while pod_ip(n) in used:
        n -= 1
    target = out[0]
    target.setdefault("endpoints", []).append(_endpoint(pod_ip(n), NODES[n % len(NODES)]))
    return out


def with_endpoint_removed(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last endpoint gone (its Pod deleted)."""
    out = _changed(slices)
    for sl in reversed(out):
        if sl.get("endpoints"):
            sl["endpoints"].pop()
            return out
    raise ValueError("no endpoint to remove")


def with_endpoint_not_ready(slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first ready endpoint fails its readiness probe (not ready, not serving)."""
    out = _changed(slices)
    for sl in out:
        for ep in sl.get("endpoints") or []:
            cond = ep.setdefault("conditions", {})
            if cond.get("ready", True):
                cond.update(ready=False, serving=False, terminating=False)
                return out
    raise ValueError("no ready endpoint")
