"""Discovery documents and /version, generated from the registry so they never disagree with
what the server actually serves.

kubectl resolves ``svc``, ``no``, ``ev`` and ``ns`` through these, and the official client's
``DynamicClient`` builds its resource map from them.
"""

from __future__ import annotations

import base64
import hashlib
import platform

from lab.apiserver.meta import JSON
from lab.apiserver.resources import GROUPS, ResourceType, in_group_version

VERSION: JSON = {
    "major": "1",
    "minor": "34",
    "emulationMajor": "1",
    "emulationMinor": "34",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "33",
    "gitVersion": "v1.34.0-ipvsproxy-lab",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.24.0",
    "compiler": "gc",
    "platform": f"linux/{'arm64' if platform.machine() == 'aarch64' else 'amd64'}",
}


def api_versions(server_address: str) -> JSON:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _hash(rt: ResourceType) -> str:
    """Stable per kind, as the real hash of the storage version is; clients only compare it."""
    digest = hashlib.sha256(f"{rt.api_version}/{rt.kind}".encode()).digest()[:8]
    return base64.b64encode(digest).decode()


def _entries(rt: ResourceType) -> list[JSON]:
    main: JSON = {
        "name": rt.plural,
        "singularName": rt.singular,
        "namespaced": rt.namespaced,
        "kind": rt.kind,
        "verbs": list(rt.verbs),
    }
    if rt.short_names:
        main["shortNames"] = list(rt.short_names)
    if rt.categories:
        main["categories"] = list(rt.categories)
    main["storageVersionHash"] = _hash(rt)
    subs: list[JSON] = [
        {
            "name": f"{rt.plural}/{sub}",
            "singularName": "",
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": ["get", "patch", "update"],
        }
        for sub in rt.subresources
    ]
    return [main, *subs]


def resource_list(group: str, version: str) -> JSON | None:
    found = in_group_version(group, version)
    if not found:
        return None
    resources = [e for rt in sorted(found, key=lambda r: r.plural) for e in _entries(rt)]
    out: JSON = {"kind": "APIResourceList"}
    if group:
        out["apiVersion"] = "v1"
    out["groupVersion"] = f"{group}/{version}" if group else version
    out["resources"] = resources
    return out


def _group(name: str) -> JSON:
    gv = {"groupVersion": f"{name}/v1", "version": "v1"}
    return {"name": name, "versions": [gv], "preferredVersion": gv}


def group_list() -> JSON:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [_group(g) for g in GROUPS]}


def group(name: str) -> JSON | None:
    if name not in GROUPS:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group(name)}
