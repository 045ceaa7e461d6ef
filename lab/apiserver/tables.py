"""Server-side printing: the meta.k8s.io/v1 Table that ``kubectl get`` asks for.

kubectl prints whatever columns the server sends, so these follow the real printers
(``pkg/printers/internalversion``): ``kubectl get svc`` here shows TYPE, CLUSTER-IP,
EXTERNAL-IP and PORT(S) as on a real cluster.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

from lab.apiserver.meta import JSON, get_path, parse_rfc3339
from lab.apiserver.resources import ResourceType

Column = tuple[str, int]  # (name, priority); priority 1 columns show with -o wide
Row = Callable[[JSON], list[object]]


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    if seconds < -1:
        return "<invalid>"
    s = max(int(seconds), 0)
    minutes, hours, days = s // 60, s // 3600, s // 86400
    if s < 120:
        return f"{s}s"
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    years = days // 365
    if years < 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"


def age(obj: JSON) -> str:
    created = parse_rfc3339(str(get_path(obj, "metadata.creationTimestamp") or ""))
    if created is None:
        return "<unknown>"
    return human_duration((datetime.datetime.now(datetime.UTC) - created).total_seconds())


def _service_external(spec: JSON, obj: JSON) -> str:
    external = list(spec.get("externalIPs") or [])
    kind = spec.get("type") or "ClusterIP"
    if kind == "ExternalName":
        return str(spec.get("externalName") or "<none>")
    if kind == "LoadBalancer":
        ingress = get_path(obj, "status.loadBalancer.ingress") or []
        found = [i.get("ip") or i.get("hostname") for i in ingress if isinstance(i, dict)]
        found = [f for f in found if f] + external
        return ",".join(found) if found else "<pending>"
    return ",".join(external) if external else "<none>"


def _service_ports(spec: JSON) -> str:
    parts = []
    for p in spec.get("ports") or []:
        node = f":{p['nodePort']}" if p.get("nodePort") else ""
        parts.append(f"{p.get('port')}{node}/{p.get('protocol', 'TCP')}")
    return ",".join(parts) if parts else "<none>"


def _selector(spec: JSON) -> str:
    sel = spec.get("selector") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(sel.items())) or "<none>"


def _service_row(obj: JSON) -> list[object]:
    spec = obj.get("spec") or {}
    ips = ",".join(spec.get("clusterIPs") or []) or "<none>"
    return [
        obj["metadata"]["name"],
        spec.get("type", "ClusterIP"),
        ips,
        _service_external(spec, obj),
        _service_ports(spec),
        age(obj),
        _selector(spec),
    ]


def _node_row(obj: JSON) -> list[object]:
    conditions = get_path(obj, "status.conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    status = "Unknown"
    if ready is not None:
        status = "Ready" if ready.get("status") == "True" else "NotReady"
    if get_path(obj, "spec.unschedulable"):
        status += ",SchedulingDisabled"
    labels = get_path(obj, "metadata.labels") or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))
    addresses = get_path(obj, "status.addresses") or []
    internal = next((a["address"] for a in addresses if a.get("type") == "InternalIP"), "<none>")
    version = get_path(obj, "status.nodeInfo.kubeletVersion") or ""
    return [
        obj["metadata"]["name"],
        status,
        ",".join(roles) or "<none>",
        age(obj),
        version,
        internal,
    ]


def _namespace_row(obj: JSON) -> list[object]:
    return [obj["metadata"]["name"], get_path(obj, "status.phase") or "", age(obj)]


def _event_row(obj: JSON) -> list[object]:
    involved = obj.get("involvedObject") or {}
    seen = (
        obj.get("lastTimestamp")
        or obj.get("eventTime")
        or get_path(obj, "metadata.creationTimestamp")
    )
    when = parse_rfc3339(str(seen or ""))
    last = "<unknown>"
    if when is not None:
        last = human_duration((datetime.datetime.now(datetime.UTC) - when).total_seconds())
    target = f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}"
    return [last, obj.get("type", ""), obj.get("reason", ""), target, obj.get("message", "")]


def _slice_row(obj: JSON) -> list[object]:
    ports = [str(p.get("port")) for p in obj.get("ports") or [] if p.get("port") is not None]
    addresses = [a for e in obj.get("endpoints") or [] for a in e.get("addresses") or []]
    shown = ",".join(addresses[:3]) or "<unset>"
    if len(addresses) > 3:
        shown += f" + {len(addresses) - 3} more..."
    return [
        obj["metadata"]["name"],
        obj.get("addressType", ""),
        ",".join(ports) or "<unset>",
        shown,
        age(obj),
    ]


_TABLES: dict[str, tuple[list[Column], Row]] = {
    "services": (
        [
            ("Name", 0),
            ("Type", 0),
            ("Cluster-IP", 0),
            ("External-IP", 0),
            ("Port(s)", 0),
            ("Age", 0),
            ("Selector", 1),
        ],
        _service_row,
    ),
    "nodes": (
        [("Name", 0), ("Status", 0), ("Roles", 0), ("Age", 0), ("Version", 0), ("Internal-IP", 1)],
        _node_row,
    ),
    "namespaces": ([("Name", 0), ("Status", 0), ("Age", 0)], _namespace_row),
    "events": (
        [("Last Seen", 0), ("Type", 0), ("Reason", 0), ("Object", 0), ("Message", 0)],
        _event_row,
    ),
    "endpointslices": (
        [("Name", 0), ("AddressType", 0), ("Ports", 0), ("Endpoints", 0), ("Age", 0)],
        _slice_row,
    ),
}


def wants_table(accept: str) -> bool:
    """Whether the Accept header's first choice is a Table (kubectl get's human output)."""
    first = accept.split(",")[0].replace(" ", "")
    return "as=Table" in first and "g=meta.k8s.io" in first


def _row(rt: ResourceType, obj: JSON, include: str) -> JSON:
    """``obj`` is the stored (core) form, which the printers read."""
    _, cells = _TABLES[rt.storage]
    row: JSON = {"cells": cells(obj)}
    if include == "Object":
        row["object"] = rt.present(obj)
    elif include != "None":
        md = dict(obj.get("metadata") or {})
        row["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": md,
        }
    return row


def table(rt: ResourceType, objects: list[JSON], list_meta: JSON, include: str) -> JSON:
    columns, _ = _TABLES[rt.storage]
    definitions = [
        {
            "name": name,
            "type": "string",
            "format": "name" if name == "Name" else "",
            "description": f"{name} of the {rt.kind}",
            "priority": priority,
        }
        for name, priority in columns
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": definitions,
        "rows": [_row(rt, obj, include) for obj in objects],
    }
