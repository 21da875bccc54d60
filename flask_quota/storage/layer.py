"""A storage layer: a ``Storage`` wrapping another, passing on what it does not change.

The deny cache and the prefetch layer each answer some decisions in-process and
leave the rest to the storage below; this class is that "rest", so each of them
defines only what it adds.
"""

from __future__ import annotations

from collections.abc import Sequence

from . import Check, Storage, Verdict
from .base import BlockEntry

__all__ = ["Layer"]


class Layer:
    """Every ``Storage`` method, passed to ``storage`` as it is."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.name = storage.name

    def peek(self, checks: Sequence[Check]) -> Verdict:
        """The storage's answer, charging nothing (nothing is kept of peeks)."""
        return self.storage.peek(checks)

    def refund(self, checks: Sequence[Check], charged_at_us: int) -> None:
        self.storage.refund(checks, charged_at_us)

    def charge(self, checks: Sequence[Check]) -> None:
        self.storage.charge(checks)

    def clear(self, keys: Sequence[str]) -> None:
        self.storage.clear(keys)

    def block(self, key: str, seconds: int, info: str) -> None:
        self.storage.block(key, seconds, info)

    def blocks(self, match: str) -> list[BlockEntry]:
        return self.storage.blocks(match)

    def block_info(self, key: str) -> str | None:
        return self.storage.block_info(key)

    def claim(self, key: str, seconds: int) -> bool:
        return self.storage.claim(key, seconds)

    def holders(self, key: str) -> list[str]:
        return self.storage.holders(key)

    def ping(self) -> float:
        """The storage's round-trip latency in seconds."""
        return self.storage.ping()

    def close(self) -> None:
        self.storage.close()
