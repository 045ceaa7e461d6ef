"""Decoding of Kubernetes protobuf request bodies for the kinds kubectl's generators create.

kubectl's typed clients (``kubectl create namespace``, ``kubectl create service ...``) send
``application/vnd.kubernetes.protobuf``, not JSON. Answers can stay JSON (those clients
accept it), but a body must be understood, so this turns the ``k8s\\0`` envelope and the
generated.proto messages of Namespace and Service into the JSON the rest of the server
handles. Fields are numbered as in ``k8s.io/api/core/v1/generated.proto``; zero values,
which protobuf always writes, are dropped as JSON's omitempty would.
"""

from __future__ import annotations

import datetime
from typing import Any, Union

from lab.apiserver import errors
from lab.apiserver.meta import JSON

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
MAGIC = b"k8s\x00"

# A field is (json name, kind); a kind is a scalar name, a message schema, or a
# ("list", kind) / ("map",) / ("time",) / ("intorstr",) tuple.
Kind = Union[str, "Schema", tuple[Any, ...]]
Schema = dict[int, tuple[str, Kind]]

STRINGS: Kind = ("list", "string")
MAP: Kind = ("map",)
TIME: Kind = ("time",)

OWNER_REFERENCE: Schema = {
    1: ("kind", "string"),
    3: ("name", "string"),
    4: ("uid", "string"),
    5: ("apiVersion", "string"),
    6: ("controller", "bool"),
    7: ("blockOwnerDeletion", "bool"),
}
OBJECT_META: Schema = {
    1: ("name", "string"),
    2: ("generateName", "string"),
    3: ("namespace", "string"),
    5: ("uid", "string"),
    6: ("resourceVersion", "string"),
    7: ("generation", "int"),
    8: ("creationTimestamp", TIME),
    11: ("labels", MAP),
    12: ("annotations", MAP),
    13: ("ownerReferences", ("list", OWNER_REFERENCE)),
    14: ("finalizers", STRINGS),
}
SERVICE_PORT: Schema = {
    1: ("name", "string"),
    2: ("protocol", "string"),
    3: ("port", "int"),
    4: ("targetPort", ("intorstr",)),
    5: ("nodePort", "int"),
    6: ("appProtocol", "string"),
}
SERVICE_SPEC: Schema = {
    1: ("ports", ("list", SERVICE_PORT)),
    2: ("selector", MAP),
    3: ("clusterIP", "string"),
    4: ("type", "string"),
    5: ("externalIPs", STRINGS),
    7: ("sessionAffinity", "string"),
    8: ("loadBalancerIP", "string"),
    9: ("loadBalancerSourceRanges", STRINGS),
    10: ("externalName", "string"),
    11: ("externalTrafficPolicy", "string"),
    12: ("healthCheckNodePort", "int"),
    13: ("publishNotReadyAddresses", "bool"),
    14: ("sessionAffinityConfig", {1: ("clientIP", {1: ("timeoutSeconds", "int")})}),
    17: ("ipFamilyPolicy", "string"),
    18: ("clusterIPs", STRINGS),
    19: ("ipFamilies", STRINGS),
    20: ("allocateLoadBalancerNodePorts", "bool"),
    21: ("loadBalancerClass", "string"),
    22: ("internalTrafficPolicy", "string"),
}
KINDS: dict[tuple[str, str], Schema] = {
    ("v1", "Namespace"): {1: ("metadata", OBJECT_META), 2: ("spec", {1: ("finalizers", STRINGS)})},
    ("v1", "Service"): {1: ("metadata", OBJECT_META), 2: ("spec", SERVICE_SPEC)},
}
_UNKNOWN: Schema = {
    1: ("typeMeta", {1: ("apiVersion", "string"), 2: ("kind", "string")}),
    2: ("raw", "bytes"),
}


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def varint(self) -> int:
        shift = value = 0
        while True:
            if self.pos >= len(self.data):
                raise ValueError("truncated varint")
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def field(self) -> tuple[int, int, Any]:
        """The next (number, wire type, raw value)."""
        tag = self.varint()
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            return number, wire, self.varint()
        if wire == 2:
            size = self.varint()
            chunk = self.data[self.pos : self.pos + size]
            if len(chunk) != size:
                raise ValueError("truncated field")
            self.pos += size
            return number, wire, chunk
        width = {1: 8, 5: 4}.get(wire)
        if width is None:
            raise ValueError(f"unsupported wire type {wire}")
        self.pos += width
        return number, wire, None


def _scalar(kind: str, raw: Any) -> Any:
    if kind == "string":
        return bytes(raw).decode("utf-8")
    if kind == "bytes":
        return bytes(raw)
    if kind == "bool":
        return bool(raw)
    value = int(raw)
    return value - (1 << 64) if value >= 1 << 63 else value


def _special(kind: tuple[Any, ...], raw: Any) -> Any:
    if kind[0] == "time":
        seconds = message(raw, {1: ("s", "int")}).get("s", 0)
        stamp = datetime.datetime.fromtimestamp(seconds, datetime.UTC)
        return stamp.strftime("%Y-%m-%dT%H:%M:%SZ") if seconds else None
    if kind[0] == "intorstr":
        parts = message(raw, {1: ("type", "int"), 2: ("int", "int"), 3: ("str", "string")})
        return parts.get("str", "") if parts.get("type") == 1 else parts.get("int", 0)
    entry = message(raw, {1: ("k", "string"), 2: ("v", "string")})
    return entry.get("k", ""), entry.get("v", "")


def _value(kind: Kind, raw: Any) -> Any:
    if isinstance(kind, dict):
        return message(raw, kind)
    if isinstance(kind, tuple):
        return _special(kind, raw)
    return _scalar(kind, raw)


def message(data: bytes, schema: Schema) -> JSON:
    out: JSON = {}
    reader = _Reader(data)
    while reader.pos < len(data):
        number, _, raw = reader.field()
        if number not in schema or raw is None:
            continue
        name, kind = schema[number]
        if isinstance(kind, tuple) and kind[0] == "map":
            key, value = _special(kind, raw)
            out.setdefault(name, {})[key] = value
        elif isinstance(kind, tuple) and kind[0] == "list":
            out.setdefault(name, []).append(_value(kind[1], raw))
        else:
            out[name] = _value(kind, raw)
    return {k: v for k, v in out.items() if v not in ("", 0, False, None, {}, [])}


def decode(body: bytes) -> JSON:
    """A JSON object from a protobuf request body; 415 for kinds this server cannot decode."""
    if not body.startswith(MAGIC):
        raise errors.bad_request("protobuf body does not start with the k8s envelope")
    try:
        envelope = message(body[len(MAGIC) :], _UNKNOWN)
        type_meta = envelope.get("typeMeta", {})
        version, kind = type_meta.get("apiVersion", ""), type_meta.get("kind", "")
        schema = KINDS.get((version, kind))
        if schema is None:
            raise errors.unsupported_media_type(["application/json"])
        obj = message(envelope.get("raw", b""), schema)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.bad_request(f"protobuf body could not be decoded: {exc}") from exc
    return {"apiVersion": version, "kind": kind, **obj}
