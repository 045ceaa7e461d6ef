"""Tracked containers note every key a mutation may change, and the state file's save looks
at those keys only."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ipvsproxy.core.virtual_servers import Protocol, ServiceKey
from ipvsproxy.dataplane.statefile import State, StateFile
from ipvsproxy.dataplane.tracked import TrackedDict, TrackedSet
from tests.unit.test_statefile import identity, sample

# Every method of the builtins, as of Python 3.11-3.13, that does not mutate. A method that a
# later Python adds to set or dict fails the test until it is sorted into one list or the
# other (and overridden in tracked.py when it mutates).
SET_READS = {
    "copy", "difference", "intersection", "isdisjoint", "issubset", "issuperset",
    "symmetric_difference", "union", "__and__", "__contains__", "__eq__", "__ge__", "__gt__",
    "__iter__", "__le__", "__len__", "__lt__", "__ne__", "__or__", "__rand__", "__ror__",
    "__rsub__", "__rxor__", "__sub__", "__xor__", "__class_getitem__", "__reduce__",
    "__repr__", "__sizeof__", "__hash__", "__init__", "__new__", "__getattribute__",
}  # fmt: skip
SET_WRITES = {
    "add", "clear", "difference_update", "discard", "intersection_update", "pop", "remove",
    "symmetric_difference_update", "update", "__iand__", "__ior__", "__isub__", "__ixor__",
}  # fmt: skip
DICT_READS = {
    "copy", "fromkeys", "get", "items", "keys", "values", "__contains__", "__eq__", "__ge__",
    "__getitem__", "__gt__", "__iter__", "__le__", "__len__", "__lt__", "__ne__", "__or__",
    "__reversed__", "__ror__", "__class_getitem__", "__repr__", "__sizeof__", "__hash__",
    "__init__", "__new__", "__getattribute__",
}  # fmt: skip
DICT_WRITES = {
    "clear", "pop", "popitem", "setdefault", "update", "__delitem__", "__ior__", "__setitem__",
}  # fmt: skip


def own_methods(cls: type) -> set[str]:
    return set(vars(cls)) - {"__doc__"}


@pytest.mark.parametrize(
    ("builtin", "tracked", "reads", "writes"),
    [(set, TrackedSet, SET_READS, SET_WRITES), (dict, TrackedDict, DICT_READS, DICT_WRITES)],
)
def test_every_mutating_method_is_overridden(
    builtin: type, tracked: type, reads: set[str], writes: set[str]
) -> None:
    assert own_methods(builtin) <= reads | writes, own_methods(builtin) - reads - writes
    assert writes <= set(vars(tracked))


K1, K2, K3 = (ServiceKey(f"10.96.0.{i}", Protocol.TCP, 80) for i in (1, 2, 3))
SET_MUTATIONS: list[tuple[str, Callable[[TrackedSet[ServiceKey]], Any], set[ServiceKey]]] = [
    ("add", lambda s: s.add(K3), {K3}),
    ("discard", lambda s: s.discard(K1), {K1}),
    ("discard absent", lambda s: s.discard(K3), set()),
    ("remove", lambda s: s.remove(K2), {K2}),
    ("pop", lambda s: s.pop(), {K1, K2}),  # either one; checked below
    ("clear", lambda s: s.clear(), {K1, K2}),
    ("update", lambda s: s.update(iter([K3]), [K1]), {K1, K3}),
    ("difference_update", lambda s: s.difference_update(iter([K1, K3])), {K1}),
    ("intersection_update", lambda s: s.intersection_update([K1]), {K2}),
    ("symmetric_difference_update", lambda s: s.symmetric_difference_update([K1, K3]), {K1, K3}),
    ("|=", lambda s: s.__ior__({K3}), {K3}),
    ("-=", lambda s: s.__isub__({K1}), {K1}),
    ("&=", lambda s: s.__iand__({K1}), {K2}),
    ("^=", lambda s: s.__ixor__({K1}), {K1}),
]


@pytest.mark.parametrize(
    ("name", "mutate", "noted"), SET_MUTATIONS, ids=[m[0] for m in SET_MUTATIONS]
)
def test_a_set_notes_what_each_mutation_changes(
    name: str, mutate: Callable[[TrackedSet[ServiceKey]], Any], noted: set[ServiceKey]
) -> None:
    s = TrackedSet([K1, K2])
    before = set(s)
    mutate(s)
    changed = before ^ set(s)
    assert changed <= s.touched
    if name == "pop":
        assert s.touched == changed
    else:
        assert s.touched == noted


def test_a_dict_notes_what_each_mutation_changes() -> None:
    d: TrackedDict[str, int] = TrackedDict({"a": 1, "b": 2})
    assert d.touched == set()
    d["c"] = 3
    del d["a"]
    d.pop("b")
    d.pop("zz", None)
    d.setdefault("e", 5)
    d.update({"f": 6}, g=7)
    d |= {"h": 8}
    assert d.touched == {"a", "b", "c", "e", "f", "g", "h", "zz"}
    d.touched.clear()
    key, _ = d.popitem()
    d.clear()
    assert d.touched == {key, "c", "e", "f", "g"}


class Unlisted(TrackedDict[Any, Any]):
    """Fails if anything walks the whole mapping."""

    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("walked every key")

    def items(self) -> Any:
        raise AssertionError("walked every item")

    def keys(self) -> Any:
        raise AssertionError("walked every key")


class UnlistedSet(TrackedSet[Any]):
    def __iter__(self) -> Iterator[Any]:
        raise AssertionError("walked every element")


def test_a_save_after_a_small_change_looks_only_at_what_changed(tmp_path: Path) -> None:
    sf = StateFile(tmp_path / "state.json")
    state = sample()
    assert sf.save(state)
    assert not sf.save(state)
    # From here on, walking all virtual servers or identities fails the save.
    state.virtual_servers = UnlistedSet(sample().virtual_servers)
    state.identities = Unlisted(dict(state.identities))
    key = ServiceKey("10.96.9.9", Protocol.TCP, 80)
    state.virtual_servers.add(key)
    state.identities["ns/svc-03"] = identity("ns/svc-03", "10.96.1.3", {"10.244.9.9": "ns/q"})
    del state.identities["ns/svc-04"]
    assert sf.save(state)
    assert not sf.save(state)  # touched was cleared by the save
    loaded = StateFile(tmp_path / "state.json").load()
    assert key in loaded.virtual_servers
    assert loaded.identities["ns/svc-03"] == state.identities["ns/svc-03"]
    assert "ns/svc-04" not in loaded.identities


def test_a_state_tracks_whatever_it_was_built_with() -> None:
    state = State(virtual_servers={K1}, identities={})
    assert isinstance(state.virtual_servers, TrackedSet)
    assert isinstance(state.identities, TrackedDict)
