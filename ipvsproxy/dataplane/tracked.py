"""A set and a dict that remember which keys changed, so that saving them costs in proportion
to the change, not to their size.

Every mutating method of ``set`` and ``dict`` is overridden to note the keys it may change in
``touched`` (a key noted may end up unchanged: the reader compares it with what it saved).
The reader clears ``touched`` once it has saved what it read. A method added to ``set`` or
``dict`` by a later Python would mutate without noting: tests/unit/test_tracked.py checks
that every mutating method of the builtins is overridden here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any, Self, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TrackedSet(set[K]):
    """A set noting in ``touched`` every element added or removed since it was cleared."""

    def __init__(self, items: Iterable[K] = ()) -> None:
        super().__init__(items)
        self.touched: set[K] = set()

    def add(self, item: K) -> None:
        self.touched.add(item)
        super().add(item)

    def discard(self, item: object) -> None:
        if item in self:
            self.touched.add(item)  # type: ignore[arg-type]  # a member: a K
        super().discard(item)

    def remove(self, item: K) -> None:
        self.touched.add(item)
        super().remove(item)

    def pop(self) -> K:
        item = super().pop()
        self.touched.add(item)
        return item

    def clear(self) -> None:
        self.touched.update(self)
        super().clear()

    def update(self, *others: Iterable[K]) -> None:
        items = [item for other in others for item in other]
        self.touched.update(items)
        super().update(items)

    def difference_update(self, *others: Iterable[Any]) -> None:
        items = [item for other in others for item in other]
        self.touched.update(item for item in items if item in self)
        super().difference_update(items)

    def intersection_update(self, *others: Iterable[Any]) -> None:
        keep = set.intersection(set(self), *[set(other) for other in others])
        self.touched.update(item for item in self if item not in keep)
        super().intersection_update(keep)

    def symmetric_difference_update(self, other: Iterable[K]) -> None:
        items = set(other)
        self.touched.update(items)
        super().symmetric_difference_update(items)

    def __ior__(self, other: AbstractSet[K]) -> Self:  # type: ignore[override,misc]  # set's typing
        self.update(other)
        return self

    def __isub__(self, other: AbstractSet[object]) -> Self:
        self.difference_update(other)
        return self

    def __iand__(self, other: AbstractSet[object]) -> Self:
        self.intersection_update(other)
        return self

    def __ixor__(self, other: AbstractSet[K]) -> Self:  # type: ignore[override,misc]  # set's typing
        self.symmetric_difference_update(other)
        return self


class TrackedDict(dict[K, V]):
    """A dict noting in ``touched`` every key set or deleted since it was cleared."""

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        super().__init__(items)
        self.touched: set[K] = set()

    def __setitem__(self, key: K, value: V) -> None:
        self.touched.add(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: K) -> None:
        self.touched.add(key)
        super().__delitem__(key)

    def pop(self, key: K, *default: Any) -> Any:
        self.touched.add(key)
        return super().pop(key, *default)

    def popitem(self) -> tuple[K, V]:
        key, value = super().popitem()
        self.touched.add(key)
        return key, value

    def setdefault(self, key: K, default: Any = None) -> Any:
        self.touched.add(key)
        return super().setdefault(key, default)

    def update(self, *args: Any, **kwargs: Any) -> None:
        items = dict(*args, **kwargs)
        self.touched.update(items)
        super().update(items)

    def clear(self) -> None:
        self.touched.update(self)
        super().clear()

    def __ior__(self, other: Any) -> Self:  # type: ignore[override,misc]  # dict's overloads
        self.update(other)
        return self
