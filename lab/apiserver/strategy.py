"""The per-kind hooks of a write, after the real server's RESTCreateStrategy/UpdateStrategy.

Each kind's module subclasses Strategy; the verbs in ``ops`` call these hooks in the order the
real registry does: prepare, default, validate, allocate, then store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lab.apiserver import validation
from lab.apiserver.errors import FieldError
from lab.apiserver.meta import JSON, deep


@dataclass
class Allocation:
    """What the other objects of the kind hold, and the allocators' cursors: both belong to one
    server's store, so two servers in one process never share allocations."""

    others: list[JSON]
    cursors: dict[str, int] = field(default_factory=dict)


class Strategy:
    """What every kind shares: a spec/status split where writes to one keep the other."""

    has_status = True

    def check_name(self, name: str) -> list[str]:
        return validation.dns1123_subdomain(name)

    def prepare_create(self, obj: JSON) -> None:
        """Clients may not set status on create (the status subresource owns it)."""
        if self.has_status:
            obj.pop("status", None)

    def prepare_update(self, new: JSON, old: JSON) -> None:
        """A write to the main resource keeps the stored status."""
        if self.has_status:
            if "status" in old:
                new["status"] = deep(old["status"])
            else:
                new.pop("status", None)

    def default(self, obj: JSON) -> None:
        """Fill what the server defaults; runs on create and on every update."""

    def validate(self, obj: JSON, old: JSON | None) -> list[FieldError]:
        return []

    def allocate(self, obj: JSON, old: JSON | None, alloc: Allocation) -> None:
        """Assign cluster-wide unique values (IPs, ports); raise APIError 422 on a clash."""

    def status_update(self, new: JSON, old: JSON) -> JSON:
        """The object a status write stores: the old one with only its status replaced."""
        out = deep(old)
        if "status" in new:
            out["status"] = deep(new["status"])
        else:
            out.pop("status", None)
        return out

    def default_status(self, obj: JSON) -> None:
        """Defaults for the status stanza, applied on status writes."""

    def validate_status(self, obj: JSON, old: JSON) -> list[FieldError]:
        return []

    def generation_changed(self, new: JSON, old: JSON) -> bool:
        """Whether an update bumps metadata.generation: any change outside metadata/status."""
        ignore = ("metadata", "status", "kind", "apiVersion")
        return {k: v for k, v in new.items() if k not in ignore} != {
            k: v for k, v in old.items() if k not in ignore
        }
