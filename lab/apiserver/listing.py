"""List requests: selectors, resourceVersion semantics and consistent paging.

A paged list is one snapshot: the first page fixes the resourceVersion, and each continue token
carries it (in the real server's token format) so later pages are read from the same
snapshot, whatever was written since. Once that resourceVersion is compacted the token gets
410 Expired, with a fresh token that continues from the latest state, as etcd3's store does.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass

from lab.apiserver import errors, selectors
from lab.apiserver.meta import JSON, labels_of
from lab.apiserver.resources import ResourceType
from lab.apiserver.store import Compacted, Key, Store

TOO_LARGE_WAIT = 3.0  # seconds the real watch cache waits to catch up with a newer resourceVersion
LIST_EXPIRED = "The resourceVersion for the provided list is too old."
CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted between "
    "the time the first chunk was returned and now may show up in the list."
)


@dataclass(frozen=True)
class Filter:
    """Which objects a list or watch request sees: its namespace and selectors."""

    rt: ResourceType
    namespace: str | None
    labels: selectors.LabelSelector
    fields: selectors.FieldSelector

    def matches(self, key: Key, obj: JSON) -> bool:
        if self.namespace and key[0] != self.namespace:
            return False
        return self.labels.matches(labels_of(obj)) and self.fields.matches(
            self.rt.field_values(obj)
        )

    @property
    def empty(self) -> bool:
        return self.labels.empty and self.fields.empty


def parse_filter(rt: ResourceType, namespace: str | None, params: Mapping[str, str]) -> Filter:
    labels = selectors.parse_labels(params.get("labelSelector"))
    fields = selectors.parse_fields(
        params.get("fieldSelector"), rt.field_labels, rt.unknown_field_msg
    )
    return Filter(rt, namespace, labels, fields)


def parse_rv(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise errors.bad_request(
            f'invalid resource version: strconv.ParseUint: parsing "{text}": invalid syntax'
        )
    return value


def encode_continue(rv: int, start: str) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        rv, start, version = data["rv"], data["start"], data["v"]
    except (binascii.Error, ValueError, KeyError, TypeError) as exc:
        raise errors.bad_request(f"continue key is not valid: {exc}") from exc
    valid = version == "meta.k8s.io/v1" and isinstance(start, str)
    if not valid or not isinstance(rv, int) or rv == 0 or rv < -1:
        raise errors.bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion "
            "(version meta.k8s.io/v1)"
        )
    return rv, start


def _string_key(all_namespaces: bool, key: Key) -> str:
    """The key relative to the list's prefix, as etcd orders it and continue tokens name it."""
    return f"{key[0]}/{key[1]}" if all_namespaces and key[0] else key[1]


def _limit(params: Mapping[str, str]) -> int:
    text = params.get("limit") or "0"
    try:
        return max(int(text), 0)
    except ValueError as exc:
        raise errors.bad_request(f"invalid limit {text!r}") from exc


def _snapshot_rv(store: Store, params: Mapping[str, str]) -> int | None:
    """The resourceVersion to read at (None: now) from resourceVersion/resourceVersionMatch."""
    text = params.get("resourceVersion") or ""
    match = params.get("resourceVersionMatch") or ""
    if match and not text:
        err = errors.forbidden(
            "resourceVersionMatch",
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        )
        raise errors.invalid_object("ListOptions", "meta.k8s.io", "", [err])
    if match and match not in ("Exact", "NotOlderThan"):
        err = errors.not_supported("resourceVersionMatch", match, ["Exact", "NotOlderThan"])
        raise errors.invalid_object("ListOptions", "meta.k8s.io", "", [err])
    if text in ("", "0"):
        return None
    rv = parse_rv(text)
    if not store.wait_for(rv, TOO_LARGE_WAIT):
        raise errors.too_large_resource_version(rv, store.rv)
    return rv if match == "Exact" else None


def list_objects(store: Store, flt: Filter, params: Mapping[str, str]) -> JSON:
    rt = flt.rt
    all_ns = rt.namespaced and not flt.namespace
    token = params.get("continue") or ""
    start = ""
    if token:
        if params.get("resourceVersion") not in (None, "", "0"):
            raise errors.bad_request(
                "specifying resource version is not allowed when using continue"
            )
        token_rv, start = decode_continue(token)
        at = None if token_rv == -1 else token_rv
    else:
        at = _snapshot_rv(store, params)
    try:
        rv, items = store.snapshot(rt.storage, at)
    except Compacted as exc:
        if token:
            raise errors.expired(
                CONTINUE_EXPIRED, {"continue": encode_continue(-1, start)}
            ) from exc
        raise errors.expired(LIST_EXPIRED) from exc
    keyed = sorted(
        ((_string_key(all_ns, k), k, o) for k, o in items if flt.matches(k, o)),
        key=lambda entry: entry[0],
    )
    keyed = [entry for entry in keyed if entry[0] >= start]
    limit = _limit(params)
    meta: JSON = {"resourceVersion": str(rv)}
    if limit and len(keyed) > limit:
        meta["continue"] = encode_continue(rv, keyed[limit - 1][0] + "\x00")
        if flt.empty:
            meta["remainingItemCount"] = len(keyed) - limit
        keyed = keyed[:limit]
    return {
        "kind": f"{rt.kind}List",
        "apiVersion": rt.api_version,
        "metadata": meta,
        "items": [rt.from_storage(o) for _, _, o in keyed],
    }
