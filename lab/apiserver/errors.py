"""API errors as the real kube-apiserver reports them: a Status object and its HTTP code.

Clients branch on ``reason`` and ``code`` (the official client raises ApiException with the
code; client-go's ``IsNotFound``/``IsConflict`` read ``reason``), and people read ``message``,
so all three follow apimachinery's ``k8s.io/apimachinery/pkg/api/errors`` wording.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lab.apiserver.meta import JSON

# field.ErrorType values (the Status cause "reason") and how their message begins.
INVALID = "FieldValueInvalid"
REQUIRED = "FieldValueRequired"
DUPLICATE = "FieldValueDuplicate"
NOT_SUPPORTED = "FieldValueNotSupported"
FORBIDDEN = "FieldValueForbidden"
TOO_LONG = "FieldValueTooLong"
TOO_MANY = "FieldValueTooMany"

_TYPE_TEXT = {
    INVALID: "Invalid value",
    REQUIRED: "Required value",
    DUPLICATE: "Duplicate value",
    NOT_SUPPORTED: "Unsupported value",
    FORBIDDEN: "Forbidden",
    TOO_LONG: "Too long",
    TOO_MANY: "Too many",
}
# Go's field.Error leaves the bad value out of the message for these.
_NO_VALUE = {REQUIRED, FORBIDDEN, TOO_LONG}


def go_value(value: Any) -> str:
    """Render a bad value the way Go's field.Error does (%q strings, %#v slices)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "[]string{" + ", ".join(json.dumps(v, ensure_ascii=False) for v in value) + "}"
    return json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class FieldError:
    """One entry of a field.ErrorList: becomes a Status cause and part of the message."""

    type: str
    field: str
    value: Any = None
    detail: str = ""

    def body(self) -> str:
        text = _TYPE_TEXT[self.type]
        if self.type not in _NO_VALUE:
            text = f"{text}: {go_value(self.value)}"
        if self.detail:
            text = f"{text}: {self.detail}"
        return text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"


def invalid(path: str, value: Any, detail: str) -> FieldError:
    return FieldError(INVALID, path, value, detail)


def required(path: str, detail: str = "") -> FieldError:
    return FieldError(REQUIRED, path, None, detail)


def duplicate(path: str, value: Any) -> FieldError:
    return FieldError(DUPLICATE, path, value)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError(FORBIDDEN, path, None, detail)


def not_supported(path: str, value: Any, supported: list[str]) -> FieldError:
    listed = ", ".join(json.dumps(s) for s in sorted(supported))
    return FieldError(NOT_SUPPORTED, path, value, f"supported values: {listed}")


@dataclass
class APIError(Exception):
    """An error answered as a Status; raised anywhere below the HTTP handler."""

    code: int
    reason: str
    message: str
    details: JSON | None = None
    list_meta: JSON = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.code} {self.reason}: {self.message}"

    def status(self) -> JSON:
        out: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": dict(self.list_meta),
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            out["details"] = self.details
        out["code"] = self.code
        return out


def _details(name: str, resource: str, group: str) -> JSON:
    out: JSON = {"name": name}
    if group:
        out["group"] = group
    out["kind"] = resource
    return out


def _qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, group: str, name: str) -> APIError:
    return APIError(
        404,
        "NotFound",
        f"{_qualified(resource, group)} {json.dumps(name)} not found",
        _details(name, resource, group),
    )


def already_exists(resource: str, group: str, name: str) -> APIError:
    return APIError(
        409,
        "AlreadyExists",
        f"{_qualified(resource, group)} {json.dumps(name)} already exists",
        _details(name, resource, group),
    )


def conflict(resource: str, group: str, name: str) -> APIError:
    message = (
        f"Operation cannot be fulfilled on {_qualified(resource, group)} {json.dumps(name)}: "
        "the object has been modified; please apply your changes to the latest version and "
        "try again"
    )
    return APIError(409, "Conflict", message, _details(name, resource, group))


def invalid_object(kind: str, group: str, name: str, errors: list[FieldError]) -> APIError:
    qualified = f"{kind}.{group}" if group else kind
    # Go's aggregate error: one error as itself, several in brackets.
    summary = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    causes = [{"reason": e.type, "message": e.body(), "field": e.field} for e in errors]
    details: JSON = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    details["causes"] = causes
    return APIError(
        422, "Invalid", f"{qualified} {json.dumps(name)} is invalid: {summary}", details
    )


def bad_request(message: str) -> APIError:
    return APIError(400, "BadRequest", message)


def forbidden_request(resource: str, group: str, name: str, why: str) -> APIError:
    message = f"{_qualified(resource, group)} {json.dumps(name)} is forbidden: {why}"
    return APIError(403, "Forbidden", message, _details(name, resource, group))


def method_not_allowed() -> APIError:
    return APIError(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        {},
    )


def path_not_found() -> APIError:
    return APIError(404, "NotFound", "the server could not find the requested resource", {})


def unsupported_media_type(accepted: list[str]) -> APIError:
    return APIError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        + ", ".join(accepted),
        {},
    )


def expired(message: str, list_meta: JSON | None = None) -> APIError:
    return APIError(410, "Expired", message, None, dict(list_meta or {}))


def too_old_watch(requested: int, oldest: int) -> APIError:
    return expired(f"too old resource version: {requested} ({oldest})")


def too_large_resource_version(requested: int, current: int) -> APIError:
    details: JSON = {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1,
    }
    message = f"Timeout: Too large resource version: {requested}, current: {current}"
    return APIError(504, "Timeout", message, details)


def internal(message: str) -> APIError:
    return APIError(
        500,
        "InternalError",
        f"Internal error occurred: {message}",
        {"causes": [{"message": message}]},
    )
