"""A bounded cache that keeps what is in use, at the cost of a dict lookup per hit."""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["Generations"]

K = TypeVar("K")
V = TypeVar("V")


class Generations(Generic[K, V]):
    """At most ``2 * size`` entries, in two generations of plain dicts.

    A hit is ``current.get(key)`` (the request path reads the dict itself); a
    miss asks ``recall``, which moves an entry of the ``retired`` generation
    back. When ``current`` is full it retires whole and the generation before
    it goes, so an entry in use is never lost to any number of others, without
    the bookkeeping an LRU does on every hit. (Emptying a full cache instead
    makes every entry be built again whenever more than ``size`` are in use.)
    """

    __slots__ = ("current", "retired", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.current: dict[K, V] = {}
        self.retired: dict[K, V] = {}

    def recall(self, key: K) -> V | None:
        """The retired generation's entry for ``key``, made current again; else None."""
        found = self.retired.pop(key, None)
        if found is not None:
            self.put(key, found)
        return found

    def put(self, key: K, value: V) -> None:
        if len(self.current) >= self.size:
            self.retired, self.current = self.current, {}
        self.current[key] = value

    def clear(self) -> None:
        self.current, self.retired = {}, {}
