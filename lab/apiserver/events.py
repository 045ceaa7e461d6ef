"""Events, served as core/v1 and as events.k8s.io/v1 from one storage, as the real server does.

Both APIs are versions of one resource: an Event written through either is visible through
both, converted field by field (``involvedObject`` is ``regarding``, ``message`` is ``note``,
``reportingComponent`` is ``reportingController``...). Storage holds the core/v1 form. The
events.k8s.io API validates new events strictly; core/v1 keeps the legacy rules.
"""

from __future__ import annotations

from lab.apiserver import errors, schema, validation
from lab.apiserver.errors import FieldError
from lab.apiserver.meta import JSON, get_path
from lab.apiserver.strategy import Strategy

# (core/v1 name, events.k8s.io/v1 name) for fields that differ; the rest are shared.
_RENAMED = [
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
]
_SHARED = ["metadata", "eventTime", "series", "reportingInstance", "action", "reason"]
_SHARED += ["related", "type"]

REF_FIELDS = ["kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath"]

CORE_SCHEMA: schema.Schema = {
    "involvedObject": schema.OBJ,
    **{f"involvedObject.{f}": schema.STR for f in REF_FIELDS},
    "reason": schema.STR,
    "message": schema.STR,
    "type": schema.STR,
    "count": schema.INT,
    "source": schema.OBJ,
    "source.component": schema.STR,
    "source.host": schema.STR,
    "reportingComponent": schema.STR,
    "reportingInstance": schema.STR,
    "action": schema.STR,
    "eventTime": schema.STR,
    "firstTimestamp": schema.STR,
    "lastTimestamp": schema.STR,
}
EVENTS_SCHEMA: schema.Schema = {
    "regarding": schema.OBJ,
    **{f"regarding.{f}": schema.STR for f in REF_FIELDS},
    "reason": schema.STR,
    "note": schema.STR,
    "type": schema.STR,
    "deprecatedCount": schema.INT,
    "reportingController": schema.STR,
    "reportingInstance": schema.STR,
    "action": schema.STR,
    "eventTime": schema.STR,
}


def to_events_v1(core: JSON) -> JSON:
    out: JSON = {}
    for key in ("kind", "apiVersion", *_SHARED):
        if key in core:
            out[key] = core[key]
    for old, new in _RENAMED:
        if old in core:
            out[new] = core[old]
    return out


def from_events_v1(obj: JSON) -> JSON:
    out: JSON = {}
    for key in ("kind", "apiVersion", *_SHARED):
        if key in obj:
            out[key] = obj[key]
    for old, new in _RENAMED:
        if new in obj:
            out[old] = obj[new]
    return out


def source_field(core: JSON) -> str:
    """The ``source`` field selector: source.component, else the reporting controller."""
    return str(get_path(core, "source.component") or core.get("reportingComponent") or "")


class CoreEventStrategy(Strategy):
    """Legacy core/v1 rules (legacyValidateEvent): namespaces must agree, little else."""

    has_status = False
    controller_field = "reportingComponent"

    def check_name(self, name: str) -> list[str]:
        return validation.path_segment(name)

    def default(self, obj: JSON) -> None:
        obj.setdefault("involvedObject", {})
        obj.setdefault("eventTime", None)
        obj.setdefault("reportingComponent", "")
        obj.setdefault("reportingInstance", "")

    def validate(self, obj: JSON, old: JSON | None) -> list[FieldError]:
        namespace = str((obj.get("metadata") or {}).get("namespace") or "")
        involved = str((obj.get("involvedObject") or {}).get("namespace") or "")
        out: list[FieldError] = []
        mismatch = errors.invalid(
            "involvedObject.namespace", involved, "does not match event.namespace"
        )
        if not obj.get("eventTime"):
            if (involved and involved != namespace) or (
                not involved and namespace not in ("", "default")
            ):
                out.append(mismatch)
            return out
        if not involved and namespace not in ("default", "kube-system"):
            out.append(mismatch)
        out += self._required(obj)
        return out

    def _required(self, obj: JSON) -> list[FieldError]:
        out: list[FieldError] = []
        controller = obj.get("reportingComponent") or ""
        if not controller:
            out.append(errors.required(self.controller_field))
        else:
            out += [
                errors.invalid(self.controller_field, controller, m)
                for m in validation.qualified_name(controller)
            ]
        for key in ("reportingInstance", "action", "reason"):
            if not obj.get(key):
                out.append(errors.required(key))
        return out


class EventsV1Strategy(CoreEventStrategy):
    """events.k8s.io/v1 creates must be complete new-style events (ValidateEventCreate)."""

    controller_field = "reportingController"

    def check_name(self, name: str) -> list[str]:
        return validation.dns1123_subdomain(name)

    def validate(self, obj: JSON, old: JSON | None) -> list[FieldError]:
        out = super().validate(obj, old)
        if old is not None:
            return out
        if not obj.get("eventTime"):
            out.append(errors.required("eventTime"))
            out += self._required(obj)
        if obj.get("type") not in ("Normal", "Warning"):
            out.append(errors.invalid("type", "", f"has invalid value: {obj.get('type') or ''}"))
        for key in ("firstTimestamp", "lastTimestamp"):
            if obj.get(key):
                out.append(
                    errors.invalid(f"deprecated{key[0].upper()}{key[1:]}", "", "needs to be unset")
                )
        if obj.get("count"):
            out.append(errors.invalid("deprecatedCount", "", "needs to be unset"))
        return out


CORE_STRATEGY = CoreEventStrategy()
EVENTS_V1_STRATEGY = EventsV1Strategy()
