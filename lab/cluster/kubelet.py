"""What the kubelets of a lab cluster would write to the API: Node objects for the lab nodes and
Pod objects for the lab pods, so the real EndpointSlice controller writes the slices.

A Node carries its InternalIP, one of each family when it has an IPv6 one too (IPv4 first, as
a dual-stack kubelet with ``--node-ip=v4,v6`` reports them; only the IPv6 one on an IPv6-only
node), and the lab's pod CIDRs; a Pod is created on its node (``spec.nodeName``), then its
status (phase Running, ``podIP``/``podIPs``, IPv4 first, only IPv6 for a pod without an IPv4
address, and the Ready condition) goes through the status subresource, as a kubelet's status
manager does. The EndpointSlice controller writes an IPv6 slice for a Service of family IPv6
from the pods' IPv6 ``podIPs``. Readiness
flips go the same way; deleting a pod with a grace period leaves it terminating (no kubelet
finishes it), which is how terminating endpoints are made; grace period 0 removes it at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import quote

MERGE_PATCH = "application/merge-patch+json"
IMAGE = "registry.k8s.io/e2e-test-images/agnhost:2.53"  # never pulled: no kubelet runs


class API(Protocol):
    """The slice of :class:`lab.cluster.controlplane.ControlPlane` the kubelets use."""

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Any: ...

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        content_type: str = ...,
        timeout: float = ...,
    ) -> tuple[int, Any]: ...


@dataclass
class LabPod:
    """A lab pod as its Pod object says: enough to be an endpoint."""

    name: str
    namespace: str
    node: str
    ip: str  # its IPv4 address; "" for an IPv6-only pod (``ip6`` then)
    labels: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)  # named container ports
    ready: bool = True
    # protocol of a named port other than TCP: a Service's named targetPort matches a
    # container port by name and protocol
    protocols: dict[str, str] = field(default_factory=dict)
    ip6: str | None = None  # its IPv6 address: podIPs lists both (IPv4 first)

    @property
    def ips(self) -> list[str]:
        """``status.podIPs`` in order: the IPv4 address, then the IPv6 one, those it has."""
        return [ip for ip in (self.ip, self.ip6) if ip]

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any], ip: str, ip6: str | None = None) -> LabPod:
        """A Pod manifest (``kind: Pod``) placed on a lab pod namespace with address ``ip``
        (and ``ip6``)."""
        md = manifest.get("metadata") or {}
        spec = manifest.get("spec") or {}
        named = [p for c in spec.get("containers") or [] for p in c.get("ports") or []]
        named = [p for p in named if p.get("name")]
        ports = {str(p["name"]): int(p["containerPort"]) for p in named}
        protocols = {str(p["name"]): str(p["protocol"]) for p in named if p.get("protocol")}
        return cls(
            name=str(md["name"]),
            namespace=str(md.get("namespace") or "default"),
            node=str(spec.get("nodeName") or ""),
            ip=ip,
            labels=dict(md.get("labels") or {}),
            ports=ports,
            protocols=protocols,
            ip6=ip6,
        )


def node_object(
    name: str,
    ip: str,
    pod_cidr: str | None = None,
    ip6: str | None = None,
    pod_cidr6: str | None = None,
) -> dict[str, Any]:
    """A Node as a kubelet registers it: an InternalIP per family (IPv4 first) and, given,
    ``spec.podCIDRs`` (IPv4 first; ``spec.podCIDR`` is the first)."""
    spec: dict[str, Any] = {}
    cidrs = [c for c in (pod_cidr, pod_cidr6) if c]
    if cidrs:
        spec = {"podCIDR": cidrs[0], "podCIDRs": cidrs}
    internal = [{"type": "InternalIP", "address": a} for a in (ip, ip6) if a]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": spec,
        # A Node may be created with its status (unlike a Pod): what a kubelet registers.
        "status": {
            "addresses": [*internal, {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


def pod_object(pod: LabPod) -> dict[str, Any]:
    ports = [
        {"name": n, "containerPort": p, "protocol": pod.protocols.get(n, "TCP")}
        for n, p in sorted(pod.ports.items())
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace, "labels": dict(pod.labels)},
        "spec": {
            "nodeName": pod.node,
            "containers": [{"name": "echo", "image": IMAGE, "ports": ports}],
        },
    }


def pod_status(pod: LabPod) -> dict[str, Any]:
    ready = "True" if pod.ready else "False"
    return {
        "status": {
            "phase": "Running",
            "podIP": pod.ips[0],
            "podIPs": [{"ip": ip} for ip in pod.ips],
            "conditions": [
                {"type": "Initialized", "status": "True"},
                {"type": "ContainersReady", "status": ready},
                {"type": "Ready", "status": ready},
                {"type": "PodScheduled", "status": "True"},
            ],
        }
    }


def _pod_path(namespace: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{quote(namespace)}/pods"
    return f"{base}/{quote(name)}" if name else base


class LabKubelets:
    """The lab's kubelets: registers Nodes and Pods and keeps their status as tests say."""

    def __init__(self, api: API) -> None:
        self.api = api
        self._pods: dict[tuple[str, str], LabPod] = {}
        self._namespaces: set[str] = {"default", "kube-system"}
        self._lock = threading.RLock()

    # Nodes ------------------------------------------------------------------------------

    def register_node(
        self,
        name: str,
        ip: str,
        pod_cidr: str | None = None,
        ip6: str | None = None,
        pod_cidr6: str | None = None,
    ) -> None:
        """A Node with InternalIP ``ip`` (and ``ip6``), pod CIDRs when given."""
        body = node_object(name, ip, pod_cidr, ip6, pod_cidr6)
        status, out = self.api.request("POST", "/api/v1/nodes", body)
        if status == 409:
            return
        if status >= 300:
            raise RuntimeError(f"registering node {name}: {status} {out}")

    # Pods -------------------------------------------------------------------------------

    def ensure_namespace(self, namespace: str) -> None:
        if namespace in self._namespaces:
            return
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        status, out = self.api.request("POST", "/api/v1/namespaces", body)
        if status >= 300 and status != 409:
            raise RuntimeError(f"creating namespace {namespace}: {status} {out}")
        self._namespaces.add(namespace)

    def add_pod(self, pod: LabPod) -> None:
        with self._lock:
            self.ensure_namespace(pod.namespace)
            self.api.call("POST", _pod_path(pod.namespace), pod_object(pod))
            self._patch_status(pod)
            self._pods[(pod.namespace, pod.name)] = pod

    def add_pods(self, pods: Iterable[LabPod]) -> None:
        for pod in pods:
            self.add_pod(pod)

    def pods(self) -> list[LabPod]:
        with self._lock:
            return list(self._pods.values())

    def pod(self, namespace: str, name: str) -> LabPod:
        with self._lock:
            return self._pods[(namespace, name)]

    def set_ready(self, namespace: str, name: str, ready: bool) -> None:
        """The pod's readiness probe passes or fails: its Ready condition follows."""
        with self._lock:
            pod = self._pods[(namespace, name)]
            pod.ready = ready
            self._patch_status(pod)

    def set_labels(self, namespace: str, name: str, labels: Mapping[str, str]) -> None:
        """Replace a pod's labels (``kubectl label --overwrite`` of all of them)."""
        with self._lock:
            pod = self._pods[(namespace, name)]
            delta: dict[str, str | None] = {k: None for k in pod.labels if k not in labels}
            delta.update(labels)
            self.update_labels({(namespace, name): delta})

    def update_labels(self, changes: Mapping[tuple[str, str], Mapping[str, str | None]]) -> None:
        """Add, change (a value) or remove (None) labels on several pods."""
        with self._lock:
            for (namespace, name), delta in changes.items():
                body = {"metadata": {"labels": dict(delta)}}
                self.api.call("PATCH", _pod_path(namespace, name), body, content_type=MERGE_PATCH)
                labels = self._pods[(namespace, name)].labels
                for k, v in delta.items():
                    if v is None:
                        labels.pop(k, None)
                    else:
                        labels[k] = v

    def remove_pod(self, namespace: str, name: str, grace_seconds: int = 0) -> None:
        """Delete the Pod: at once (grace 0), or leave it terminating for ``grace_seconds``
        (no kubelet runs, so it stays terminating until removed with grace 0)."""
        with self._lock:
            body = {
                "kind": "DeleteOptions",
                "apiVersion": "v1",
                "gracePeriodSeconds": grace_seconds,
            }
            status, out = self.api.request("DELETE", _pod_path(namespace, name), body)
            if status >= 300 and status != 404:
                raise RuntimeError(f"deleting pod {namespace}/{name}: {status} {out}")
            if grace_seconds == 0:
                self._pods.pop((namespace, name), None)

    def _patch_status(self, pod: LabPod) -> None:
        self.api.call(
            "PATCH",
            _pod_path(pod.namespace, pod.name) + "/status",
            pod_status(pod),
            content_type=MERGE_PATCH,
        )
