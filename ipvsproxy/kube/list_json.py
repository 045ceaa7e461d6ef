"""A list's JSON decoded one item at a time.

A list is never held decoded whole: the watch cache answers a list at resourceVersion "0" with
every object at once, and decoded whole those dicts (managedFields and all) were the daemon's
peak memory, and the heap it then keeps (docs/performance.md). ``walk_list`` hands each item to
its caller as soon as it is decoded, with ``json``'s own C decoder; the caller keeps only what
it makes of it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_DECODE = json.JSONDecoder().raw_decode
_SPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, idx: int) -> int:
    end = _SPACE.match(text, idx)
    return end.end() if end else idx


def _expect(text: str, idx: int, chars: str, what: str) -> str:
    c = text[idx : idx + 1]
    if not c or c not in chars:
        raise json.JSONDecodeError(f"Expecting {what}", text, idx)
    return c


def walk_list(text: str, on_item: Callable[[Any], None]) -> dict[str, Any]:
    """Decode ``text``, a JSON object, as ``json.loads`` would, except that each element of
    its top-level ``items`` array is passed to ``on_item`` in order (and not kept). Returns the
    object's other members (``metadata``, ``kind``...). Malformed text raises
    ``json.JSONDecodeError``, possibly after some items were passed on."""
    out: dict[str, Any] = {}
    idx = _skip(text, 0)
    _expect(text, idx, "{", "'{'")
    idx = _skip(text, idx + 1)
    if text[idx : idx + 1] != "}":
        while True:
            _expect(text, idx, '"', "property name enclosed in double quotes")
            key, idx = _DECODE(text, idx)
            idx = _skip(text, idx)
            _expect(text, idx, ":", "':' delimiter")
            idx = _skip(text, idx + 1)
            if key == "items" and text[idx : idx + 1] == "[":
                idx = _walk_array(text, idx, on_item)
            else:
                out[key], idx = _DECODE(text, idx)
            idx = _skip(text, idx)
            if _expect(text, idx, ",}", "',' delimiter") == "}":
                break
            idx = _skip(text, idx + 1)
    if _skip(text, idx + 1) != len(text):
        raise json.JSONDecodeError("Extra data", text, idx + 1)
    return out


def _walk_array(text: str, idx: int, on_item: Callable[[Any], None]) -> int:
    """The elements of the array at ``idx``, each to ``on_item``; returns the index past it."""
    idx = _skip(text, idx + 1)
    if text[idx : idx + 1] == "]":
        return idx + 1
    while True:
        item, idx = _DECODE(text, idx)
        on_item(item)
        idx = _skip(text, idx)
        if _expect(text, idx, ",]", "',' delimiter") == "]":
            return idx + 1
        idx = _skip(text, idx + 1)
