"""``walk_list``: a list's items decoded one at a time, as ``json.loads`` decodes the whole."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from ipvsproxy.kube.list_json import walk_list


def walked(text: str) -> tuple[dict[str, Any], list[Any]]:
    items: list[Any] = []
    rest = walk_list(text, items.append)
    return rest, items


LISTS = [
    {"kind": "ServiceList", "metadata": {"resourceVersion": "7"}, "items": []},
    {"metadata": {"continue": "abc", "remainingItemCount": 3}, "items": [{"a": 1}, {"b": [2]}]},
    {"items": [{"x": 'é\u2028"}]\\'}, None, 1, "s", [1, {"y": {}}]], "kind": "L"},
    {"items": None, "metadata": {}},
    {"items": {"not": "an array"}},
    {},
    {"apiVersion": "v1", "items": [{"metadata": {"name": "items"}, "items": [1, 2]}]},
]


@pytest.mark.parametrize("doc", LISTS)
@pytest.mark.parametrize("indent", [None, 0, 2])
def test_it_decodes_as_json_loads_with_the_items_passed_on(
    doc: dict[str, Any], indent: Any
) -> None:
    text = json.dumps(doc, indent=indent, ensure_ascii=indent is None)
    rest, items = walked(" \n" + text + "\n ")
    whole = json.loads(text)
    if isinstance(whole.get("items"), list):
        assert items == whole.pop("items")
    else:
        assert items == []
    assert rest == whole


def test_each_item_is_handed_on_as_soon_as_it_is_decoded() -> None:
    text = json.dumps({"metadata": {}, "items": [{"n": 1}, {"n": 2}]}) + "garbage"
    items: list[Any] = []
    with pytest.raises(json.JSONDecodeError, match="Extra data"):
        walk_list(text, items.append)
    assert items == [{"n": 1}, {"n": 2}]


@pytest.mark.parametrize(
    "text",
    ["", "{", '{"items": [1, 2}', '{"items": [1 2]}', '{"a" 1}', '{a: 1}', '{"a": 1,}',
     '{"items": [1,]}', '{"a": 1} {}', '{"items": [1], }'],
)  # fmt: skip
def test_malformed_text_raises_as_json_loads_does(text: str) -> None:
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        walk_list(text, lambda item: None)


@pytest.mark.parametrize("text", ["[]", '"items"', "null", "1"])
def test_json_that_is_not_an_object_is_refused(text: str) -> None:
    with pytest.raises(json.JSONDecodeError, match=re.escape("Expecting '{'")):
        walk_list(text, lambda item: None)
