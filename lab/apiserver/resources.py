"""The resource registry: every kind this server serves, with what discovery says about it.

One entry per (group, version, resource). Entries that share a ``bucket`` are versions of one
stored resource (the two Event APIs); ``to_storage``/``from_storage`` convert between the
served form and the stored one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from lab.apiserver import cluster, endpointslices, events, schema, services
from lab.apiserver.meta import JSON, field_string, get_path, with_type
from lab.apiserver.strategy import Strategy

FieldGetter = Callable[[JSON], str]
Converter = Callable[[JSON], JSON]

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
# The real server has no deletecollection for Namespaces.
VERBS_NO_COLLECTION_DELETE = tuple(v for v in VERBS if v != "deletecollection")
_META_FIELDS = ("metadata.name", "metadata.namespace")
_DEFAULT_FIELD_MSG = (
    '"{field}" is not a known field selector: only "metadata.name", "metadata.namespace"'
)
_LABEL_FIELD_MSG = "field label not supported: {field}"


def path(dotted: str) -> FieldGetter:
    return lambda obj: field_string(get_path(obj, dotted))


def fields(*dotted: str, **special: FieldGetter) -> dict[str, FieldGetter]:
    out = {d: path(d) for d in (*_META_FIELDS, *dotted)}
    out.update({k.replace("__", "."): v for k, v in special.items()})
    return out


def _identity(obj: JSON) -> JSON:
    return obj


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    singular: str
    kind: str
    namespaced: bool
    strategy: Strategy
    schema: schema.Schema
    bucket: str = ""
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    verbs: tuple[str, ...] = VERBS
    subresources: tuple[str, ...] = ()
    field_labels: Mapping[str, FieldGetter] = field(default_factory=lambda: fields())
    unknown_field_msg: str = _DEFAULT_FIELD_MSG
    create_on_update: bool = False
    return_deleted: bool = False
    to_storage: Converter = _identity
    from_storage: Converter = _identity

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def storage(self) -> str:
        return self.bucket or self.plural

    def present(self, stored: JSON) -> JSON:
        """The stored object as this API version serves it, with its kind and apiVersion."""
        return with_type(self.from_storage(stored), self.kind, self.api_version)

    def field_values(self, stored: JSON) -> dict[str, str]:
        return {label: get(stored) for label, get in self.field_labels.items()}


def _events_label(label: str) -> str:
    return label.replace("involvedObject.", "regarding.").replace(
        "reportingComponent", "reportingController"
    )


_CORE_EVENT_FIELDS = fields(
    *(f"involvedObject.{f}" for f in events.REF_FIELDS),
    "reason",
    "reportingComponent",
    "type",
    source=events.source_field,
)

REGISTRY: tuple[ResourceType, ...] = (
    ResourceType(
        "", "v1", "services", "service", "Service", True, services.STRATEGY, services.SCHEMA,
        short_names=("svc",), categories=("all",),
        subresources=("status",), return_deleted=True,
        field_labels=fields("spec.clusterIP", "spec.type"),
    ),
    ResourceType(
        "", "v1", "nodes", "node", "Node", False, cluster.NODE_STRATEGY, cluster.NODE_SCHEMA,
        short_names=("no",), subresources=("status",),
        field_labels=fields("spec.unschedulable"), unknown_field_msg=_LABEL_FIELD_MSG,
    ),
    ResourceType(
        "", "v1", "namespaces", "namespace", "Namespace", False, cluster.NAMESPACE_STRATEGY,
        cluster.NAMESPACE_SCHEMA, short_names=("ns",), verbs=VERBS_NO_COLLECTION_DELETE,
        subresources=("status",), return_deleted=True,
        field_labels=fields("status.phase"), unknown_field_msg=_LABEL_FIELD_MSG,
    ),
    ResourceType(
        "", "v1", "events", "event", "Event", True, events.CORE_STRATEGY, events.CORE_SCHEMA,
        short_names=("ev",), create_on_update=True, field_labels=_CORE_EVENT_FIELDS,
        unknown_field_msg=_LABEL_FIELD_MSG,
    ),
    ResourceType(
        "events.k8s.io", "v1", "events", "event", "Event", True, events.EVENTS_V1_STRATEGY,
        events.EVENTS_SCHEMA, bucket="events", short_names=("ev",), create_on_update=True,
        field_labels={_events_label(k): v for k, v in _CORE_EVENT_FIELDS.items()},
        unknown_field_msg=_LABEL_FIELD_MSG,
        to_storage=events.from_events_v1, from_storage=events.to_events_v1,
    ),
    ResourceType(
        "discovery.k8s.io", "v1", "endpointslices", "endpointslice", "EndpointSlice", True,
        endpointslices.STRATEGY, endpointslices.SCHEMA,
    ),
)  # fmt: skip

GROUPS: tuple[str, ...] = ("discovery.k8s.io", "events.k8s.io")


def lookup(group: str, version: str, plural: str) -> ResourceType | None:
    for rt in REGISTRY:
        if (rt.group, rt.version, rt.plural) == (group, version, plural):
            return rt
    return None


def in_group_version(group: str, version: str) -> list[ResourceType]:
    return [rt for rt in REGISTRY if (rt.group, rt.version) == (group, version)]


def namespaced_buckets() -> set[str]:
    return {rt.storage for rt in REGISTRY if rt.namespaced}


def core(plural: str) -> ResourceType:
    rt = lookup("", "v1", plural)
    assert rt is not None
    return rt
