"""What the informers keep of each object: the fields ipvsproxy reads, nothing else.

The watch cache holds every Service and EndpointSlice of the cluster for the life of the
process, and an object as decoded from the API carries much that ipvsproxy never reads (an
endpoint's uid, ownerReferences, a conditions dict each, a fresh copy of every node name and
namespace). Upstream kube-proxy trims its informers' objects too (it drops managedFields).
Here an object keeps the fields the planner (``ipvsproxy.core.service_ports``), the daemon's
marks and health checks read; repeated short strings are interned and the few distinct
conditions are shared. Pure functions of the decoded JSON; the result is again JSON-shaped,
read-only mappings (slotted, a third of a dict's size) that every reader reads with ``get``
and ``[]`` as it reads the API's dicts. The slim objects are shared and cannot be modified.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Self

from ipvsproxy.core.service_ports import LABEL_SERVICE_NAME, SCHEDULER_ANNOTATION

Obj = dict[str, Any]

TRIGGER_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"
# The only annotations kept: a slice's trigger time, a Service's own scheduler.
_ANNOTATIONS = (TRIGGER_ANNOTATION, SCHEDULER_ANNOTATION)
_METADATA = ("name", "namespace", "resourceVersion", "deletionTimestamp")
_SLICE_ENDPOINT = ("nodeName", "zone", "hints", "hostname")
_CONDITIONS: dict[tuple[Any, Any, Any], Obj] = {}


def _intern(value: Any) -> Any:
    return sys.intern(value) if isinstance(value, str) else value


def _metadata(
    meta: Mapping[str, Any], labels: tuple[str, ...] | None, created: bool = False
) -> Metadata:
    """name, namespace, resourceVersion (the informer compares it), deletionTimestamp; the
    labels named in ``labels`` (None: all of them) and the annotations of _ANNOTATIONS; with
    ``created``, creationTimestamp (a Service's: who had a virtual server first)."""
    out: Obj = {k: meta[k] for k in _METADATA if k in meta}
    if created and "creationTimestamp" in meta:
        out["creationTimestamp"] = meta["creationTimestamp"]
    if "namespace" in out:
        out["namespace"] = _intern(out["namespace"])
    found = meta.get("labels") or {}
    kept = dict(found) if labels is None else {k: found[k] for k in labels if k in found}
    if kept:
        out["labels"] = {_intern(k): _intern(v) for k, v in kept.items()}
    given = meta.get("annotations") or {}
    annotations = {k: given[k] for k in _ANNOTATIONS if k in given}
    if annotations:
        out["annotations"] = annotations
    return Metadata.of(out)


def _interned(value: Any) -> Any:
    """Strings interned all the way down (a Service's spec: types, protocols, policies)."""
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, dict):
        return {sys.intern(k): _interned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_interned(v) for v in value]
    return value


# The spec fields the planner reads (service_ports.is_proxied, service_ports.service_ports)
# and the daemon's health checks; a port's name, protocol, port and nodePort.
_SPEC = (
    "type",
    "clusterIP",
    "clusterIPs",
    "externalIPs",
    "sessionAffinity",
    "sessionAffinityConfig",
    "ports",
    "loadBalancerSourceRanges",
    "externalTrafficPolicy",
    "internalTrafficPolicy",
    "healthCheckNodePort",
)
_PORT = ("name", "protocol", "port", "nodePort")


def _port(port: Any) -> Any:
    if not isinstance(port, Mapping):
        return port  # malformed: kept as sent, for the planner to judge
    return Port.of(_interned({k: port[k] for k in _PORT if k in port}))


def _or_whole(
    compact: Callable[[Mapping[str, Any]], Mapping[str, Any]],
) -> Callable[[Mapping[str, Any]], Mapping[str, Any]]:
    """An object too malformed to compact is kept whole: the planner then names what is wrong
    with it (an informer that raised here would drop the event)."""

    def run(obj: Mapping[str, Any]) -> Mapping[str, Any]:
        try:
            return compact(obj)
        except (AttributeError, TypeError, KeyError, ValueError):
            return dict(obj)

    run.__doc__ = compact.__doc__
    return run


@_or_whole
def service(obj: Mapping[str, Any]) -> Service:
    """metadata (all labels: proxy-name and headless rules read them), the spec fields read,
    and status.loadBalancer (its ingress IPs are load-balancer VIPs)."""
    out: Obj = {"metadata": _metadata(obj.get("metadata") or {}, None, created=True)}
    if "spec" in obj:
        spec = obj["spec"] or {}
        kept = _interned({k: spec[k] for k in _SPEC if k in spec and k != "ports"})
        if isinstance(spec.get("ports"), list):
            kept["ports"] = [_port(p) for p in spec["ports"]]
        elif "ports" in spec:
            kept["ports"] = spec["ports"]  # malformed: kept as sent, for the planner to judge
        ips = spec.get("clusterIPs")
        if isinstance(ips, list) and ips == [spec.get("clusterIP")]:
            del kept["clusterIPs"]  # the reader falls back to [clusterIP]
        out["spec"] = Spec.of(kept)
    lb = (obj.get("status") or {}).get("loadBalancer")
    if lb:
        out["status"] = {"loadBalancer": _interned(lb)}
    return Service.of(out)


def _conditions(cond: Any) -> Obj | None:
    if not isinstance(cond, Mapping):
        return None
    key = (cond.get("ready"), cond.get("serving"), cond.get("terminating"))
    if any(v not in (None, True, False) for v in key):
        return dict(cond)  # malformed: kept as sent, for the planner to judge
    shared = _CONDITIONS.get(key)
    if shared is None:
        names = ("ready", "serving", "terminating")
        shared = {k: v for k, v in zip(names, key, strict=True) if v is not None}
        _CONDITIONS[key] = shared
    return shared


class Slots(Mapping[str, Any]):
    """A read-only mapping over a few fixed keys, stored in slots: a third of a dict's size.
    Readers use ``get`` (made direct, as a missing key is common) and ``[]``; None means
    absent."""

    __slots__ = ()
    FIELDS: tuple[str, ...] = ()
    _FIELDS: frozenset[str] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._FIELDS = frozenset(cls.FIELDS)

    def get(self, key: str, default: Any = None) -> Any:
        if key not in self._FIELDS:
            return default
        value = getattr(self, key)
        return default if value is None else value

    def __getitem__(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[str]:
        return (k for k in self.FIELDS if self.get(k) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:
        # Readers test these (``spec or {}``) far more often than they count them: true at the
        # first field set, rather than counting every one.
        return any(getattr(self, k) is not None for k in self.FIELDS)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self)!r})"

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Self:
        """One holding ``values`` (absent fields None); every key must be a field."""
        obj = cls.__new__(cls)
        for k in cls.FIELDS:
            setattr(obj, k, values.get(k))
        return obj


# What a Service or a slice keeps, as slotted mappings rather than dicts (a third of the size
# of a dict of the same keys: see Slots).


class Metadata(Slots):
    FIELDS = (
        "name",
        "namespace",
        "resourceVersion",
        "deletionTimestamp",
        "labels",
        "annotations",
        "creationTimestamp",
    )
    __slots__ = FIELDS


class Port(Slots):
    FIELDS = ("name", "protocol", "port", "nodePort")
    __slots__ = FIELDS


class Spec(Slots):
    FIELDS = _SPEC
    __slots__ = FIELDS


class Service(Slots):
    FIELDS = ("metadata", "spec", "status")
    __slots__ = FIELDS


class EndpointSlice(Slots):
    FIELDS = ("metadata", "addressType", "ports", "endpoints")
    __slots__ = FIELDS


class Ref(Slots):
    """An endpoint's targetRef: kind, namespace and name are all anyone reads. A Pod's is kept
    as its ``namespace/name`` path, the string the planner names real servers by, so the
    planner shares it rather than building a copy per endpoint."""

    __slots__ = ("_name", "kind", "namespace", "pod")
    FIELDS = ("kind", "namespace", "name")

    def __init__(self, kind: Any, namespace: Any, name: Any, slice_namespace: Any) -> None:
        self.kind, self.namespace = kind, namespace
        self.pod: str | None = None
        self._name: Any = name
        if kind is None and isinstance(name, str) and name:
            self.pod = f"{namespace or slice_namespace or 'default'}/{name}"
            self._name = None

    def get(self, key: str, default: Any = None) -> Any:
        if key == "name":
            name = self._name if self.pod is None else self.pod.partition("/")[2]
            return default if name is None else name
        return super().get(key, default)

    @property
    def plain_pod(self) -> bool:
        """A Pod in the slice's namespace: all there is to it is its path."""
        return self.pod is not None and self.kind is None and self.namespace is None

    @classmethod
    def of_pod(cls, path: str) -> Ref:
        namespace, _, name = path.partition("/")
        return cls(None, None, name, namespace)


class SliceEndpoint(Slots):
    """One endpoint of a slice, as the planner and the health checks read it. Its one address
    is held as the string, and a targetRef naming a Pod of the slice's namespace as the Pod's
    ``namespace/name`` path (``pod``): no tuple and no Ref is kept per endpoint. ``addresses``
    and ``targetRef`` are built when read as a mapping."""

    __slots__ = ("_address", "_ref", "conditions", "hints", "hostname", "nodeName", "zone")
    FIELDS = ("addresses", "conditions", "nodeName", "zone", "hints", "hostname", "targetRef")

    def __init__(self, values: Mapping[str, Any]) -> None:
        for k in ("conditions", "hints", "hostname", "nodeName", "zone"):
            setattr(self, k, values.get(k))
        addresses = values.get("addresses")
        if isinstance(addresses, list) and len(addresses) == 1 and isinstance(addresses[0], str):
            self._address: Any = addresses[0]
        else:
            self._address = tuple(addresses) if isinstance(addresses, list) else addresses
        ref = values.get("targetRef")
        self._ref: Any = ref.pod if isinstance(ref, Ref) and ref.plain_pod else ref

    @property
    def addresses(self) -> Any:
        a = self._address
        return (a,) if type(a) is str else a

    @property
    def targetRef(self) -> Any:  # the API field's name
        r = self._ref
        return Ref.of_pod(r) if type(r) is str else r

    @property
    def pod(self) -> str | None:
        """The Pod's ``namespace/name`` when the targetRef names one (what the planner reads)."""
        r = self._ref
        return r if type(r) is str else getattr(r, "pod", None)


def _endpoint(ep: Mapping[str, Any], namespace: Any) -> SliceEndpoint:
    values: Obj = {"addresses": ep.get("addresses")}
    values["conditions"] = _conditions(ep.get("conditions"))
    for k in _SLICE_ENDPOINT:
        if k in ep:
            values[k] = _interned(ep[k])
    ref = ep.get("targetRef")
    if isinstance(ref, Mapping):
        kind, ns = _intern(ref.get("kind")), _intern(ref.get("namespace"))
        # Pod is the reader's default kind; the slice's namespace its default namespace.
        values["targetRef"] = Ref(
            None if kind == "Pod" else kind,
            None if ns == namespace else ns,
            ref.get("name"),
            namespace,
        )
    elif ref is not None:
        values["targetRef"] = ref  # malformed: kept as sent, for the planner to judge
    return SliceEndpoint(values)


@_or_whole
def endpoint_slice(obj: Mapping[str, Any]) -> EndpointSlice:
    """metadata (the service-name label, the trigger-time annotation), addressType, ports,
    and per endpoint: addresses, conditions, nodeName, zone, hints, hostname, targetRef."""
    meta = _metadata(obj.get("metadata") or {}, (LABEL_SERVICE_NAME,))
    namespace = meta.get("namespace")
    out: Obj = {"metadata": meta}
    if "addressType" in obj:
        out["addressType"] = _intern(obj["addressType"])
    if obj.get("ports") is not None:
        out["ports"] = _interned(obj["ports"])
    if obj.get("endpoints") is not None:
        out["endpoints"] = [_endpoint(ep, namespace) for ep in obj["endpoints"]]
    return EndpointSlice.of(out)
