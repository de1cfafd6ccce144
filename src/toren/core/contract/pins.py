"""What the digest cache (:class:`toren.core.contract.digest.HashCache`) uses to know that a
value it hashed earlier still holds the same JSON: :class:`Pinned` (the very objects,
checked by identity, in C) and :func:`shape_of` (a value's exact JSON content as a
hashable key: equal shapes are equal JSON)."""

from __future__ import annotations

from collections.abc import Mapping
from itertools import chain
from operator import is_
from typing import Any

from toren.core.contract.model_types import FrozenList, Message, ToolSpec

# Values that cannot change: pinned by their identity alone. A Message refuses changes at
# every depth (its nested values are frozen when it is built). A FrozenList is not here:
# it refuses changes to its own items, but one built directly may hold a plain dict.
_FIXED = frozenset({str, int, float, bool, type(None), Message})


class Pinned:
    """Proof that JSON values hashed earlier still hold the same JSON, checked in C.

    It keeps the values' containers (alive, so no id is recycled), each one's length, and
    the very key and item objects each held when it was pinned. A value can be pinned when
    its containers are plain dicts with string keys, lists, tuples and FrozenLists, and
    every other value in it is a str, int, float, bool or None (or an immutable Message),
    all of which never change. So the same containers, of the same lengths, holding the
    same objects hold the same JSON; identity is compared, never equality, which would
    take ``1``, ``1.0`` and ``True`` for one another (three different JSON values).
    """

    __slots__ = ("_dicts", "_items", "_keys", "_lens", "_lists", "_sized", "_values")

    def __init__(self) -> None:
        self._dicts: list[dict[str, object]] = []
        self._lists: list[list[object] | tuple[object, ...]] = []
        self._sized: list[Any] = []  # the dicts and lists in pinning order, for _lens
        self._lens: list[int] = []
        self._keys: list[str] = []
        self._values: list[object] = []
        self._items: list[object] = []

    def add(self, value: Any) -> bool:
        """Pin ``value`` too; False (and nothing pinned) if it cannot be pinned."""
        dicts: list[dict[str, Any]] = []
        lists: list[list[object] | tuple[object, ...]] = []
        stack = [value]
        while stack:
            v = stack.pop()
            t = type(v)
            if t in _FIXED:
                continue
            if t is dict:
                if not all(type(k) is str for k in v):
                    return False
                dicts.append(v)
                stack.extend(v.values())
            elif t is list or t is tuple or t is FrozenList:
                lists.append(v)
                stack.extend(v)
            else:
                return False
        for d in dicts:
            self._sized.append(d)
            self._lens.append(len(d))
            self._keys.extend(d)
            self._values.extend(d.values())
        for seq in lists:
            self._sized.append(seq)
            self._lens.append(len(seq))
            self._items.extend(seq)
        self._dicts += dicts
        self._lists += lists
        return True

    def holds(self) -> bool:
        """Whether every pinned container still holds the very objects it held."""
        return (
            list(map(len, self._sized)) == self._lens
            and all(map(is_, chain.from_iterable(self._dicts), self._keys))
            and all(map(is_, chain.from_iterable(map(dict.values, self._dicts)), self._values))
            and all(map(is_, chain.from_iterable(self._lists), self._items))
        )


def shape_of(obj: object) -> object:
    if type(obj) is dict:
        # The common message: a flat dict of strings. A str stands for itself (its type is
        # known); anything else is shaped as below, so the two can never compare equal.
        items = tuple(obj.items())
        for _, v in items:
            if type(v) is not str:
                return tuple((k, v if type(v) is str else shape_of(v)) for k, v in items)
        return items
    if isinstance(obj, Mapping):
        return tuple((k, shape_of(v)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return (list, *(shape_of(v) for v in obj))
    if isinstance(obj, ToolSpec):
        return (obj.name, obj.description, shape_of(obj.parameters))
    # The type keeps 1, 1.0 and True apart: equal in Python, different in JSON; a float's
    # exact bits keep 0.0 and -0.0 apart (equal in Python, "0.0" and "-0.0" in JSON).
    if type(obj) is float:
        return (float, obj.hex())
    return (type(obj), obj)
