"""Plain-JSON helpers shared by every module: objects are the dicts clients send and receive.

The server keeps objects as decoded JSON rather than typed models, so that what it stores and
answers is exactly the wire form the real API server produces and clients parse.
"""

from __future__ import annotations

import copy
import datetime
import uuid
from typing import Any

JSON = dict[str, Any]


def now_rfc3339() -> str:
    """Seconds-precision UTC time, the format of creationTimestamp on the real server."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: str) -> datetime.datetime | None:
    try:
        return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def new_uid() -> str:
    return str(uuid.uuid4())


def deep(obj: JSON) -> JSON:
    """A private copy: stored objects are shared with watchers and must never change."""
    return copy.deepcopy(obj)


def metadata(obj: JSON) -> JSON:
    """The object's metadata dict, created if absent (callers own ``obj``)."""
    md = obj.get("metadata")
    if not isinstance(md, dict):
        md = {}
        obj["metadata"] = md
    return md


def name_of(obj: JSON) -> str:
    md = obj.get("metadata")
    name = md.get("name") if isinstance(md, dict) else None
    return name if isinstance(name, str) else ""


def get_path(obj: Any, dotted: str) -> Any:
    """The value at a dotted path such as ``involvedObject.name``; None if a step is missing."""
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


def field_string(value: Any) -> str:
    """A field selector compares strings: Go renders bools lower-case and absent values empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def labels_of(obj: JSON) -> dict[str, str]:
    md = obj.get("metadata")
    labels = md.get("labels") if isinstance(md, dict) else None
    if not isinstance(labels, dict):
        return {}
    return {str(k): str(v) for k, v in labels.items()}


def without_type(obj: JSON) -> JSON:
    """List items carry no kind/apiVersion on the wire, as the real server sends them."""
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def with_type(obj: JSON, kind: str, api_version: str) -> JSON:
    """kind and apiVersion first, then the rest in stored order, as the real server writes."""
    out: JSON = {"kind": kind, "apiVersion": api_version}
    out.update(without_type(obj))
    return out
