"""A minimal OpenAPI v3: just what kubectl reads to learn the server validates fields itself.

``kubectl create``/``replace`` (default ``--validate=strict``) look up each kind's PATCH
operation in /openapi/v3 for a ``fieldValidation`` query parameter; finding it, they leave
validation to the server instead of downloading full schemas. Without this document they
refuse to run unless given ``--validate=false``.
"""

from __future__ import annotations

import hashlib
import json

from lab.apiserver.meta import JSON
from lab.apiserver.resources import GROUPS, ResourceType, in_group_version

_FIELD_VALIDATION: JSON = {
    "name": "fieldValidation",
    "in": "query",
    "description": "fieldValidation instructs the server on how to handle objects in the "
    "request containing unknown or duplicate fields.",
    "schema": {"type": "string", "uniqueItems": True},
}


def _gv_path(group: str) -> str:
    return f"apis/{group}/v1" if group else "api/v1"


def _object_path(rt: ResourceType) -> str:
    prefix = "/" + _gv_path(rt.group)
    scope = "/namespaces/{namespace}" if rt.namespaced else ""
    return f"{prefix}{scope}/{rt.plural}/{{name}}"


def group_version_doc(group: str) -> JSON | None:
    found = in_group_version(group, "v1")
    if not found:
        return None
    paths: JSON = {}
    for rt in found:
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        paths[_object_path(rt)] = {
            "patch": {
                "operationId": f"patch{rt.kind}",
                "parameters": [_FIELD_VALIDATION],
                "responses": {"200": {"description": "OK"}},
                "x-kubernetes-action": "patch",
                "x-kubernetes-group-version-kind": gvk,
            }
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.34.0"},
        "paths": paths,
        "components": {"schemas": {}},
    }


def _hash(group: str) -> str:
    text = json.dumps(group_version_doc(group), sort_keys=True)
    return hashlib.sha512(text.encode()).hexdigest()[:64].upper()


def root() -> JSON:
    paths = {
        _gv_path(g): {"serverRelativeURL": f"/openapi/v3/{_gv_path(g)}?hash={_hash(g)}"}
        for g in ("", *GROUPS)
    }
    return {"paths": paths}


def lookup(parts: list[str]) -> JSON | None:
    """The document for /openapi/v3/api/v1 or /openapi/v3/apis/GROUP/v1."""
    rest = parts[2:]
    if rest == ["api", "v1"]:
        return group_version_doc("")
    if len(rest) == 3 and rest[0] == "apis" and rest[2] == "v1" and rest[1] in GROUPS:
        return group_version_doc(rest[1])
    return None
