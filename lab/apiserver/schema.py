"""JSON type checks for the fields the server reads: the 400 a Go decoder gives, not a 500.

The real server decodes into Go structs, so ``"port": "80"`` fails decoding with a
BadRequest before any validation runs. A schema here lists dotted paths (``[]`` for each list
element, ``*`` for each map value) and the JSON type each must have when present.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lab.apiserver import errors

Schema = Mapping[str, tuple[type, ...]]

INT = (int,)
STR = (str,)
BOOL = (bool,)
OBJ = (dict,)
LIST = (list,)
INT_OR_STR = (int, str)

_GO_NAMES = {int: "int32", str: "string", bool: "bool", dict: "object", list: "array"}


def _json_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def _ok(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def _walk(value: Any, parts: list[str]) -> list[Any]:
    """Every value at the path below ``value`` (several where it crosses lists and maps)."""
    if not parts:
        return [value]
    head, rest = parts[0], parts[1:]
    if head == "[]":
        items = value if isinstance(value, list) else []
        return [v for item in items for v in _walk(item, rest)]
    if head == "*":
        values = value.values() if isinstance(value, dict) else []
        return [v for item in values for v in _walk(item, rest)]
    if not isinstance(value, dict) or value.get(head) is None:
        return []
    return _walk(value[head], rest)


def _split(path: str) -> list[str]:
    return path.replace("[]", ".[]").split(".")


def check(obj: Any, schema: Schema, kind: str, api_version: str) -> None:
    if not isinstance(obj, dict):
        raise errors.bad_request(
            f"{kind} in version {api_version!r} cannot be handled: not an object"
        )
    for path, types in schema.items():
        for value in _walk(obj, _split(path)):
            if value is None or _ok(value, types):
                continue
            want = " or ".join(_GO_NAMES.get(t, t.__name__) for t in types)
            field = path.replace("[]", "")
            raise errors.bad_request(
                f'{kind} in version "{api_version}" cannot be handled as a {kind}: json: cannot '
                f"unmarshal {_json_name(value)} into Go struct field {kind}.{field} of type {want}"
            )
