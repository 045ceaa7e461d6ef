"""The cluster-scoped kinds: Nodes (a kube-proxy reads its own) and Namespaces.

Nodes may be created with their status, as a kubelet registers itself; afterwards status
changes only through the status subresource. Namespaces get the phase, finalizer and
``kubernetes.io/metadata.name`` label the real server gives them.
"""

from __future__ import annotations

import ipaddress

from lab.apiserver import errors, schema, validation
from lab.apiserver.errors import FieldError
from lab.apiserver.meta import JSON, metadata
from lab.apiserver.strategy import Strategy

NAME_LABEL = "kubernetes.io/metadata.name"
# The namespaces the real server creates at start-up, and the ones it refuses to delete.
SYSTEM_NAMESPACES = ("default", "kube-node-lease", "kube-public", "kube-system")
UNDELETABLE_NAMESPACES = ("default", "kube-public", "kube-system")
TAINT_EFFECTS = ["NoExecute", "NoSchedule", "PreferNoSchedule"]

NODE_SCHEMA: schema.Schema = {
    "spec": schema.OBJ,
    "spec.podCIDR": schema.STR,
    "spec.podCIDRs": schema.LIST,
    "spec.podCIDRs[]": schema.STR,
    "spec.unschedulable": schema.BOOL,
    "spec.taints": schema.LIST,
    "spec.taints[]": schema.OBJ,
    "spec.taints[].key": schema.STR,
    "spec.taints[].effect": schema.STR,
    "status": schema.OBJ,
    "status.addresses": schema.LIST,
    "status.addresses[]": schema.OBJ,
    "status.addresses[].type": schema.STR,
    "status.addresses[].address": schema.STR,
    "status.conditions": schema.LIST,
    "status.conditions[]": schema.OBJ,
}
NAMESPACE_SCHEMA: schema.Schema = {
    "spec": schema.OBJ,
    "spec.finalizers": schema.LIST,
    "spec.finalizers[]": schema.STR,
    "status": schema.OBJ,
    "status.phase": schema.STR,
}


class NodeStrategy(Strategy):
    def prepare_create(self, obj: JSON) -> None:
        """A kubelet registers its Node with status filled in; the real server keeps it."""

    def default(self, obj: JSON) -> None:
        spec = obj.setdefault("spec", {})
        if spec.get("podCIDR") and not spec.get("podCIDRs"):
            spec["podCIDRs"] = [spec["podCIDR"]]
        elif spec.get("podCIDRs") and not spec.get("podCIDR"):
            spec["podCIDR"] = spec["podCIDRs"][0]
        self.default_status(obj)

    def default_status(self, obj: JSON) -> None:
        status = obj.get("status")
        if isinstance(status, dict) and "capacity" in status and "allocatable" not in status:
            status["allocatable"] = dict(status["capacity"])

    def validate(self, obj: JSON, old: JSON | None) -> list[FieldError]:
        spec = obj.get("spec") or {}
        out: list[FieldError] = []
        for i, cidr in enumerate(spec.get("podCIDRs") or []):
            try:
                ipaddress.ip_network(cidr)
            except ValueError:
                detail = "must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"
                out.append(errors.invalid(f"spec.podCIDRs[{i}]", cidr, detail))
        for i, taint in enumerate(spec.get("taints") or []):
            key = taint.get("key") or ""
            out += [
                errors.invalid(f"spec.taints[{i}].key", key, m)
                for m in validation.qualified_name(key)
            ]
            effect = taint.get("effect")
            if not effect:
                out.append(errors.required(f"spec.taints[{i}].effect"))
            elif effect not in TAINT_EFFECTS:
                out.append(errors.not_supported(f"spec.taints[{i}].effect", effect, TAINT_EFFECTS))
        if old is not None:
            out += _immutable_once_set(obj, old)
        return out

    def validate_status(self, obj: JSON, old: JSON) -> list[FieldError]:
        out: list[FieldError] = []
        for i, address in enumerate((obj.get("status") or {}).get("addresses") or []):
            if not address.get("type"):
                out.append(errors.required(f"status.addresses[{i}].type"))
        return out


def _immutable_once_set(new: JSON, old: JSON) -> list[FieldError]:
    old_cidrs = (old.get("spec") or {}).get("podCIDRs") or []
    new_cidrs = (new.get("spec") or {}).get("podCIDRs") or []
    if old_cidrs and new_cidrs != old_cidrs:
        return [
            errors.forbidden(
                "spec.podCIDRs", 'node updates may not change podCIDR except from "" to valid'
            )
        ]
    return []


class NamespaceStrategy(Strategy):
    def check_name(self, name: str) -> list[str]:
        return validation.dns1123_label(name)

    def prepare_create(self, obj: JSON) -> None:
        obj["status"] = {"phase": "Active"}
        finalizers = list((obj.get("spec") or {}).get("finalizers") or [])
        if "kubernetes" not in finalizers:
            finalizers.append("kubernetes")
        obj["spec"] = {"finalizers": finalizers}

    def prepare_update(self, new: JSON, old: JSON) -> None:
        super().prepare_update(new, old)
        new["spec"] = dict(old.get("spec") or {})

    def default(self, obj: JSON) -> None:
        md = metadata(obj)
        name = md.get("name")
        if name:
            md["labels"] = {**(md.get("labels") or {}), NAME_LABEL: name}

    def validate_status(self, obj: JSON, old: JSON) -> list[FieldError]:
        phase = (obj.get("status") or {}).get("phase")
        if phase is not None and phase not in ("Active", "Terminating"):
            return [errors.not_supported("status.phase", phase, ["Active", "Terminating"])]
        return []


NODE_STRATEGY = NodeStrategy()
NAMESPACE_STRATEGY = NamespaceStrategy()
