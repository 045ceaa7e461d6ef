"""The lab's EndpointSlice controller: Services with a selector get slices of the lab pods.

A real cluster's kube-controller-manager turns Pods that match a Service's selector into
EndpointSlices. The lab API server serves no Pods (a kube-proxy never reads them), so this
controller keeps the lab's Pod objects itself: a test or the demo registers each lab pod (its
name, namespace, node, IP, labels and named ports) and changes its labels, and the controller
keeps one managed slice per Service and target-port set in the API server, as upstream's does:
labelled ``kubernetes.io/service-name`` and ``endpointslice.kubernetes.io/managed-by``, owned by
the Service, one endpoint per matching pod with ``nodeName`` and a ``targetRef``. Services
without a selector are left alone (their slices are written by hand, as on a real cluster).

It runs in the process that owns the :class:`~lab.apiserver.APIServer`, writes through its
``Operations`` (so defaults, validation and watch events are the server's own) and re-reads
everything whenever the store moves or a pod changes: a lab has a handful of Services.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lab.apiserver import APIServer
from lab.apiserver.errors import APIError
from lab.apiserver.resources import ResourceType, lookup

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "endpointslice-controller.lab.ipvsproxy"


def _resource(group: str, plural: str) -> ResourceType:
    rt = lookup(group, "v1", plural)
    if rt is None:
        raise LookupError(plural)
    return rt


SERVICES = _resource("", "services")
SLICES = _resource("discovery.k8s.io", "endpointslices")


@dataclass
class LabPod:
    """A Pod object as the controller sees it: enough to be an endpoint."""

    name: str
    namespace: str
    node: str
    ip: str
    labels: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)  # named container ports
    ready: bool = True

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any], ip: str) -> LabPod:
        """A Pod manifest (``kind: Pod``) placed on a lab pod namespace with address ``ip``."""
        md = manifest.get("metadata") or {}
        spec = manifest.get("spec") or {}
        ports = {
            str(p["name"]): int(p["containerPort"])
            for c in spec.get("containers") or []
            for p in c.get("ports") or []
            if p.get("name")
        }
        return cls(
            name=str(md["name"]),
            namespace=str(md.get("namespace") or "default"),
            node=str(spec.get("nodeName") or ""),
            ip=ip,
            labels=dict(md.get("labels") or {}),
            ports=ports,
        )


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """A Service selector: every key present with that value (an empty one selects nothing)."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def _target(port: Mapping[str, Any], pod: LabPod) -> int | None:
    target = port.get("targetPort", port.get("port"))
    if isinstance(target, int):
        return target
    if isinstance(target, str) and target.isdigit():
        return int(target)
    return pod.ports.get(str(target))


def desired_slices(service: Mapping[str, Any], pods: Iterable[LabPod]) -> dict[str, dict[str, Any]]:
    """The managed slices of one Service, by name: one per distinct set of resolved ports."""
    md = service.get("metadata") or {}
    spec = service.get("spec") or {}
    name, namespace = str(md.get("name")), str(md.get("namespace"))
    selector = spec.get("selector") or {}
    groups: dict[tuple[tuple[str, str, int], ...], list[LabPod]] = {}
    for pod in sorted(pods, key=lambda p: p.name):
        if pod.namespace != namespace or not matches(selector, pod.labels):
            continue
        resolved = []
        for port in spec.get("ports") or []:
            target = _target(port, pod)
            if target is not None:
                resolved.append((str(port.get("name") or ""), port.get("protocol", "TCP"), target))
        groups.setdefault(tuple(resolved), []).append(pod)
    out: dict[str, dict[str, Any]] = {}
    for ports, members in groups.items():
        digest = hashlib.sha1(json.dumps(ports).encode()).hexdigest()[:5]
        slice_name = f"{name}-{digest}"
        out[slice_name] = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": slice_name,
                "namespace": namespace,
                "labels": {SERVICE_NAME_LABEL: name, MANAGED_BY_LABEL: MANAGED_BY},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Service",
                        "name": name,
                        "uid": md.get("uid", ""),
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "addressType": "IPv4",
            "endpoints": [
                {
                    "addresses": [p.ip],
                    "conditions": {"ready": p.ready, "serving": p.ready, "terminating": False},
                    "nodeName": p.node,
                    "targetRef": {"kind": "Pod", "namespace": p.namespace, "name": p.name},
                }
                for p in members
            ],
            "ports": [{"name": n, "protocol": proto, "port": port} for n, proto, port in ports],
        }
    return out


def _comparable(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    md = obj.get("metadata") or {}
    return (md.get("labels"), obj.get("endpoints"), obj.get("ports"))


class EndpointSliceController:
    def __init__(self, server: APIServer, resync: float = 1.0) -> None:
        self.server = server
        self.resync = resync
        self._pods: dict[tuple[str, str], LabPod] = {}
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.errors: list[str] = []

    # Pods -------------------------------------------------------------------------------

    def add_pod(self, pod: LabPod) -> None:
        with self._lock:
            self._pods[(pod.namespace, pod.name)] = pod
            self.reconcile()

    def pods(self) -> list[LabPod]:
        with self._lock:
            return list(self._pods.values())

    def pod(self, namespace: str, name: str) -> LabPod:
        with self._lock:
            return self._pods[(namespace, name)]

    def set_labels(self, namespace: str, name: str, labels: Mapping[str, str]) -> None:
        """Replace a pod's labels (``kubectl label --overwrite`` of all of them)."""
        with self._lock:
            self._pods[(namespace, name)].labels = dict(labels)
            self.reconcile()

    def update_labels(self, changes: Mapping[tuple[str, str], Mapping[str, str | None]]) -> None:
        """Add, change (a value) or remove (None) labels on several pods, then reconcile once."""
        with self._lock:
            for key, delta in changes.items():
                labels = self._pods[key].labels
                for k, v in delta.items():
                    if v is None:
                        labels.pop(k, None)
                    else:
                        labels[k] = v
            self.reconcile()

    def remove_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            self._pods.pop((namespace, name), None)
            self.reconcile()

    # The loop ---------------------------------------------------------------------------

    def reconcile(self) -> int:
        """Make every managed slice what the Services and pods say; returns the writes made."""
        ops, store = self.server.ops, self.server.store
        writes = 0
        with self._lock:
            services = {
                (s["metadata"]["namespace"], s["metadata"]["name"]): s
                for s in store.values(SERVICES.storage)
            }
            existing: dict[tuple[str, str], dict[str, Any]] = {}
            for sl in store.values(SLICES.storage):
                md = sl.get("metadata") or {}
                if (md.get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY:
                    existing[(md["namespace"], md["name"])] = sl
            wanted: dict[tuple[str, str], dict[str, Any]] = {}
            for (namespace, _name), svc in services.items():
                if (svc.get("spec") or {}).get("selector"):
                    for slice_name, body in desired_slices(svc, self._pods.values()).items():
                        wanted[(namespace, slice_name)] = body
            for key, body in wanted.items():
                old = existing.get(key)
                try:
                    if old is None:
                        ops.create(SLICES, key[0], body)
                        writes += 1
                    elif _comparable(old) != _comparable(body):
                        body["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                        ops.update(SLICES, key[0], key[1], body)
                        writes += 1
                except APIError as exc:  # e.g. the namespace went away under us
                    self.errors.append(f"{key}: {exc}")
            for key in existing.keys() - wanted.keys():
                with contextlib.suppress(APIError):
                    ops.delete(SLICES, key[0], key[1], {})
                    writes += 1
        return writes

    def _run(self) -> None:
        seen = -1
        while not self._stop.is_set():
            rv = self.server.store.rv
            if rv != seen:
                # Taken before the pass: a write landing during it (a Service created while
                # the slices are computed) gets a pass of its own. Marking the store's version
                # after the pass lost such writes for good. Our own writes cost one more pass,
                # which writes nothing.
                seen = rv
                self.reconcile()
            # Wake on the next change (or after ``resync``); a closed store answers at once.
            if not self.server.store.wait_for(seen + 1, self.resync):
                self._stop.wait(0.05)

    def start(self) -> EndpointSliceController:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="lab-slices", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
