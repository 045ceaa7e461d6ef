"""The three patch types the API server accepts: JSON merge, strategic merge, JSON patch.

Strategic merge is a JSON merge patch that merges the lists Kubernetes declares with a merge
key (``spec.ports`` by ``port``, conditions by ``type``...) instead of replacing them, and
honours the ``$patch`` directives kubectl emits. That is enough for what ``kubectl patch`` and
the official client (which sends dict bodies as strategic merge) do with these kinds.
"""

from __future__ import annotations

import copy
from typing import Any

from lab.apiserver import errors

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

# Lists that strategic merge merges element-wise, keyed by this field (patchMergeKey).
_MERGE_KEYS = {
    "spec.ports": "port",
    "metadata.ownerReferences": "uid",
    "status.conditions": "type",
    "status.addresses": "type",
}
# Lists of scalars that strategic merge unions (patchStrategy "merge", no key).
_SET_LISTS = {"metadata.finalizers", "spec.podCIDRs"}


class PatchError(Exception):
    """A patch that decodes but cannot apply: the real server's 422."""


def apply(content_type: str, target: dict[str, Any], patch: Any) -> dict[str, Any]:
    kind = content_type.split(";")[0].strip().lower()
    if kind == JSON_PATCH:
        result = json_patch(target, patch)
    elif kind == MERGE_PATCH:
        if not isinstance(patch, dict):
            raise errors.bad_request("merge patch must be a JSON object")
        result = merge_patch(target, patch)
    elif kind == STRATEGIC_PATCH:
        if not isinstance(patch, dict):
            raise errors.bad_request("strategic merge patch must be a JSON object")
        result = strategic_merge(target, patch, "")
    else:
        raise errors.unsupported_media_type([JSON_PATCH, MERGE_PATCH, STRATEGIC_PATCH])
    if not isinstance(result, dict):
        raise PatchError("the patched document is not an object")
    return result


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def strategic_merge(target: Any, patch: dict[str, Any], path: str) -> Any:
    directive = patch.get("$patch")
    if directive == "delete":
        return None
    body = {k: v for k, v in patch.items() if not k.startswith("$")}
    if directive == "replace" or not isinstance(target, dict):
        return {k: v for k, v in copy.deepcopy(body).items() if v is not None}
    out = dict(target)
    for key, value in body.items():
        sub = _join(path, key)
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge(out.get(key), value, sub)
            if merged is None:
                out.pop(key, None)
            else:
                out[key] = merged
        elif isinstance(value, list):
            out[key] = _merge_list(out.get(key), value, sub)
        else:
            out[key] = copy.deepcopy(value)
    for key, drop in patch.items():
        if key.startswith("$deleteFromPrimitiveList/") and isinstance(drop, list):
            name = key.split("/", 1)[1]
            if isinstance(out.get(name), list):
                out[name] = [v for v in out[name] if v not in drop]
    retain = patch.get("$retainKeys")
    if isinstance(retain, list):
        out = {k: v for k, v in out.items() if k in retain}
    return out


def _merge_list(target: Any, patch: list[Any], path: str) -> list[Any]:
    current = list(target) if isinstance(target, list) else []
    if path in _SET_LISTS:
        return current + [v for v in patch if v not in current]
    key = _MERGE_KEYS.get(path)
    if key is None or not all(isinstance(item, dict) for item in patch):
        return [_strip_directives(v) for v in copy.deepcopy(patch)]
    if any(item.get("$patch") == "replace" for item in patch):
        return [_strip_directives(v) for v in patch if v.get("$patch") != "replace"]
    for item in patch:
        idx = next(
            (
                i
                for i, cur in enumerate(current)
                if isinstance(cur, dict) and cur.get(key) == item.get(key)
            ),
            None,
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                current.pop(idx)
        elif idx is None:
            current.append(_strip_directives(copy.deepcopy(item)))
        else:
            current[idx] = strategic_merge(current[idx], item, path)
    return current


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    return value


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str):
        raise errors.bad_request("json patch: path must be a string")
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _index(container: list[Any], token: str, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r}")
    idx = int(token)
    if idx > len(container) or (idx == len(container) and not allow_end):
        raise PatchError(f"array index {idx} out of bounds")
    return idx


def _parent(doc: Any, tokens: list[str]) -> Any:
    cur = doc
    for tok in tokens[:-1]:
        if isinstance(cur, dict) and tok in cur:
            cur = cur[tok]
        elif isinstance(cur, list):
            cur = cur[_index(cur, tok, False)]
        else:
            raise PatchError(f"doc is missing path: /{'/'.join(tokens)}")
    return cur


def _get(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        return doc
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(parent, last, False)]
    raise PatchError(f"doc is missing path: /{'/'.join(tokens)}")


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent = _parent(doc, tokens)
    if isinstance(parent, dict):
        parent[tokens[-1]] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, tokens[-1], True), value)
    else:
        raise PatchError(f"doc is missing path: /{'/'.join(tokens)}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent = _parent(doc, tokens)
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(parent, last, False))
    raise PatchError(f"unable to remove nonexistent key: {last}: missing value")


def json_patch(target: dict[str, Any], ops: Any) -> Any:
    """RFC 6902, applied to a copy so that a failing operation leaves nothing half-done."""
    if not isinstance(ops, list) or not all(isinstance(op, dict) for op in ops):
        raise errors.bad_request("json patch must be a JSON array of operation objects")
    doc: Any = copy.deepcopy(target)
    for op in ops:
        doc = _apply_op(doc, op)
    return doc


def _apply_op(doc: Any, op: dict[str, Any]) -> Any:
    name = op.get("op")
    tokens = _pointer(op.get("path"))
    if name in ("add", "replace", "test") and "value" not in op:
        raise errors.bad_request(f"json patch: {name} operation has no value")
    if name == "add":
        return _add(doc, tokens, copy.deepcopy(op["value"]))
    if name == "remove":
        _remove(doc, tokens)
        return doc
    if name == "replace":
        _get(doc, tokens)
        if not tokens:
            return copy.deepcopy(op["value"])
        _remove(doc, tokens)
        return _add(doc, tokens, copy.deepcopy(op["value"]))
    if name in ("move", "copy"):
        source = _pointer(op.get("from"))
        value = _remove(doc, source) if name == "move" else copy.deepcopy(_get(doc, source))
        return _add(doc, tokens, value)
    if name == "test":
        if _get(doc, tokens) != op["value"]:
            raise PatchError(f"testing value {op.get('path')} failed: test failed")
        return doc
    raise errors.bad_request(f"json patch: unexpected kind of operation: {name!r}")
