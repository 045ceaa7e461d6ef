"""The write verbs and get: create, update, patch, delete, deletecollection, with the real
registry's ordering of checks.

Order matters because clients see the first failure: a namespace that does not exist (404)
before validation (422), validation before allocation clashes (422), those before a duplicate
name (409). An update that changes nothing is not written: the object keeps its
resourceVersion and no watch event is sent, as etcd's GuaranteedUpdate skips no-op writes.
"""

from __future__ import annotations

import json
import random
from typing import Any

from lab.apiserver import errors, patch, schema, validation
from lab.apiserver.meta import JSON, deep, labels_of, metadata, new_uid, now_rfc3339, without_type
from lab.apiserver.resources import REGISTRY, ResourceType
from lab.apiserver.selectors import FieldSelector, LabelSelector
from lab.apiserver.store import Key, Store
from lab.apiserver.strategy import Allocation

_GENERATE_CHARS = "bcdfghjklmnpqrstvwxz2456789"
_SYSTEM_META = (
    "uid",
    "creationTimestamp",
    "generation",
    "deletionTimestamp",
    "selfLink",
    "deletionGracePeriodSeconds",
    "managedFields",
)


def decode_json(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise errors.bad_request(f"couldn't get version/kind; json parse error: {exc}") from exc


class Operations:
    """The verbs against one store; allocator cursors live here, one set per server."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.cursors: dict[str, int] = {}

    def _key(self, rt: ResourceType, namespace: str | None, name: str) -> Key:
        return (namespace or "" if rt.namespaced else "", name)

    def _decode(self, rt: ResourceType, body: Any) -> JSON:
        """Check the body's type, kind and apiVersion, then convert it to the stored form, which
        carries no kind/apiVersion: those belong to the API version an object is served as."""
        schema.check(body, {}, rt.kind, rt.api_version)
        kind, version = body.get("kind"), body.get("apiVersion")
        if (kind and kind != rt.kind) or (version and version != rt.api_version):
            raise errors.bad_request(
                f'{kind or rt.kind} in version "{version or rt.api_version}" cannot be handled '
                f"as a {rt.kind}: the object provided is unrecognized (must be of type {rt.kind})"
            )
        problem = validation.check_meta_types(body)
        if problem:
            raise errors.bad_request(
                f"{rt.kind} in version {rt.api_version!r} cannot be handled: {problem}"
            )
        schema.check(body, rt.schema, rt.kind, rt.api_version)
        return without_type(deep(rt.to_storage(body)))

    def _namespace(self, rt: ResourceType, namespace: str | None, obj: JSON) -> None:
        md = metadata(obj)
        if not rt.namespaced:
            md.pop("namespace", None)
            return
        if md.get("namespace") and md["namespace"] != namespace:
            raise errors.bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        md["namespace"] = namespace

    def _require_namespace(self, rt: ResourceType, namespace: str | None) -> None:
        if rt.namespaced and self.store.get("namespaces", ("", namespace or "")) is None:
            raise errors.not_found("namespaces", "", namespace or "")

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> JSON:
        obj = self.store.get(rt.storage, self._key(rt, namespace, name))
        if obj is None:
            raise errors.not_found(rt.plural, rt.group, name)
        return rt.present(obj)

    def create(
        self, rt: ResourceType, namespace: str | None, body: Any, dry_run: bool = False
    ) -> JSON:
        obj = self._decode(rt, body)
        self._namespace(rt, namespace, obj)
        md = metadata(obj)
        if md.get("resourceVersion"):
            raise errors.internal("resourceVersion should not be set on objects to be created")
        if not md.get("name") and md.get("generateName"):
            suffix = "".join(random.choice(_GENERATE_CHARS) for _ in range(5))
            md["name"] = f"{md['generateName']}{suffix}"
        name = str(md.get("name") or "")
        with self.store.lock:
            self._require_namespace(rt, namespace)
            rt.strategy.prepare_create(obj)
            for field in _SYSTEM_META:
                md.pop(field, None)
            md.update(uid=new_uid(), creationTimestamp=now_rfc3339(), generation=1)
            rt.strategy.default(obj)
            self._validate(rt, obj, None, name)
            key = self._key(rt, namespace, name)
            rt.strategy.allocate(obj, None, self._allocation(rt, key))
            if self.store.get(rt.storage, key) is not None:
                raise errors.already_exists(rt.plural, rt.group, name)
            if dry_run:
                return rt.present(obj)
            return rt.present(self.store.put(rt.storage, key, obj))

    def _validate(self, rt: ResourceType, obj: JSON, old: JSON | None, name: str) -> None:
        errs = validation.object_meta(obj, rt.strategy.check_name)
        errs += rt.strategy.validate(obj, old)
        if errs:
            raise errors.invalid_object(rt.kind, rt.group, name, errs)

    def _allocation(self, rt: ResourceType, key: Key) -> Allocation:
        others = [o for k, o in self._items(rt.storage) if k != key]
        return Allocation(others, self.cursors)

    def _items(self, bucket: str) -> list[tuple[Key, JSON]]:
        return self.store.snapshot(bucket, None)[1]

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> tuple[JSON, bool]:
        """PUT; answers the object and whether it was created (kinds that allow that)."""
        obj = self._decode(rt, body)
        self._namespace(rt, namespace, obj)
        md = metadata(obj)
        if md.get("name") and md["name"] != name:
            raise errors.bad_request(
                f"the name of the object ({md['name']}) does not match the name on the URL ({name})"
            )
        md["name"] = name
        with self.store.lock:
            old = self.store.get(rt.storage, self._key(rt, namespace, name))
            if old is None:
                if rt.create_on_update and subresource is None:
                    md.pop("resourceVersion", None)
                    return self.create(rt, namespace, rt.present(obj), dry_run), True
                raise errors.not_found(rt.plural, rt.group, name)
            return self._write_update(rt, obj, old, subresource, dry_run), False

    def _write_update(
        self, rt: ResourceType, obj: JSON, old: JSON, subresource: str | None, dry_run: bool
    ) -> JSON:
        md = metadata(obj)
        name = str(md.get("name"))
        self._check_preconditions(rt, name, md.get("resourceVersion"), md.get("uid"), old)
        if subresource == "status":
            new = rt.strategy.status_update(obj, old)
            rt.strategy.default_status(new)
            errs = rt.strategy.validate_status(new, old)
            if errs:
                raise errors.invalid_object(rt.kind, rt.group, name, errs)
        else:
            new = obj
            rt.strategy.prepare_update(new, old)
            nmd = metadata(new)
            for field in _SYSTEM_META:
                nmd.pop(field, None)
            old_md = old.get("metadata") or {}
            for field in ("uid", "creationTimestamp", "generation"):
                if field in old_md:
                    nmd[field] = old_md[field]
            rt.strategy.default(new)
            self._validate(rt, new, old, name)
            key = self._key(rt, nmd.get("namespace"), name)
            rt.strategy.allocate(new, old, self._allocation(rt, key))
            if rt.strategy.generation_changed(new, old):
                nmd["generation"] = int(old_md.get("generation") or 0) + 1
        return self._commit_update(rt, new, old, dry_run)

    def _commit_update(self, rt: ResourceType, new: JSON, old: JSON, dry_run: bool) -> JSON:
        def comparable(obj: JSON) -> JSON:
            out = dict(obj)
            out["metadata"] = {
                k: v for k, v in (obj.get("metadata") or {}).items() if k != "resourceVersion"
            }
            return out

        if comparable(new) == comparable(old):
            return rt.present(old)
        metadata(new)["resourceVersion"] = (old.get("metadata") or {}).get("resourceVersion")
        if dry_run:
            return rt.present(new)
        key = self._key(rt, metadata(new).get("namespace"), str(metadata(new).get("name")))
        return rt.present(self.store.put(rt.storage, key, new))

    def _check_preconditions(
        self, rt: ResourceType, name: str, rv: Any, uid: Any, old: JSON
    ) -> None:
        old_md = old.get("metadata") or {}
        if rv and rv != old_md.get("resourceVersion"):
            raise errors.conflict(rt.plural, rt.group, name)
        if uid and uid != old_md.get("uid"):
            err = errors.conflict(rt.plural, rt.group, name)
            err.message = (
                f"Operation cannot be fulfilled on {rt.plural} {json.dumps(name)}: Precondition "
                f"failed: UID in precondition: {uid}, UID in object meta: {old_md.get('uid')}"
            )
            raise err

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        content_type: str,
        raw: bytes,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> JSON:
        document = decode_json(raw)
        with self.store.lock:
            old = self.store.get(rt.storage, self._key(rt, namespace, name))
            if old is None:
                raise errors.not_found(rt.plural, rt.group, name)
            try:
                patched = patch.apply(content_type, rt.present(old), document)
            except patch.PatchError as exc:
                raise errors.APIError(422, "Invalid", str(exc)) from exc
            obj = self._decode(rt, patched)
            self._namespace(rt, namespace, obj)
            if metadata(obj).get("name") != name:
                raise errors.bad_request(
                    f"the name of the object does not match the name on the URL ({name})"
                )
            return self._write_update(rt, obj, old, subresource, dry_run)

    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        options: Any,
        dry_run: bool = False,
    ) -> JSON:
        pre = options.get("preconditions") if isinstance(options, dict) else None
        pre = pre if isinstance(pre, dict) else {}
        with self.store.lock:
            key = self._key(rt, namespace, name)
            old = self.store.get(rt.storage, key)
            if old is None:
                raise errors.not_found(rt.plural, rt.group, name)
            self._check_preconditions(rt, name, pre.get("resourceVersion"), pre.get("uid"), old)
            if rt.plural == "namespaces":
                self._delete_namespace_contents(name, dry_run)
            gone = old if dry_run else self.store.delete(rt.storage, key)
        if rt.return_deleted:
            return rt.present(gone)
        details: JSON = {"name": name}
        if rt.group:
            details["group"] = rt.group
        details.update(kind=rt.plural, uid=(gone.get("metadata") or {}).get("uid", ""))
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": details,
        }

    def _delete_namespace_contents(self, namespace: str, dry_run: bool) -> None:
        """What the namespace controller does before the namespace finally goes."""
        from lab.apiserver.cluster import UNDELETABLE_NAMESPACES

        if namespace in UNDELETABLE_NAMESPACES:
            raise errors.forbidden_request(
                "namespaces", "", namespace, "this namespace may not be deleted"
            )
        if dry_run:
            return
        for bucket in sorted({rt.storage for rt in REGISTRY if rt.namespaced}):
            for key, _ in self._items(bucket):
                if key[0] == namespace:
                    self.store.delete(bucket, key)

    def delete_collection(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        dry_run: bool = False,
    ) -> JSON:
        with self.store.lock:
            rv, items = self.store.snapshot(rt.storage, None)
            gone: list[JSON] = []
            for key, obj in items:
                if rt.namespaced and namespace and key[0] != namespace:
                    continue
                if not labels.matches(labels_of(obj)):
                    continue
                if not fields.matches(rt.field_values(obj)):
                    continue
                gone.append(obj if dry_run else self.store.delete(rt.storage, key))
            rv = self.store.rv
        return {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.api_version,
            "metadata": {"resourceVersion": str(rv)},
            "items": [rt.present(o) for o in gone],
        }
