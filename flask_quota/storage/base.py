"""What every backend implements, and the values that cross the boundary."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from ..algorithms import Algorithm, Gate, Outcome
from ..clock import Clock, wall_clock_us
from ..rates import Rate

__all__ = [
    "BlockEntry",
    "Check",
    "Clock",
    "Storage",
    "StorageError",
    "Verdict",
    "shadow_flags",
    "wall_clock_us",
    "wraps_errors",
]

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Check:
    """One tier's question to the storage: may ``cost`` units pass on ``key``?

    A ``shadow`` check is decided like any other but never denies: when it would,
    it is not charged and the other checks are decided as if it were absent.
    """

    key: str
    algorithm: Algorithm | Gate
    rate: Rate
    cost: int
    shadow: bool = False


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer for all checks of one request, decided atomically.

    ``shadow`` flags the shadow checks (parallel to ``outcomes``; empty when
    there are none): their denials do not deny.
    """

    now_us: int
    outcomes: tuple[Outcome, ...]
    shadow: tuple[bool, ...] = ()

    @property
    def allowed(self) -> bool:
        """True when every enforced check allowed (a shadow denial does not deny)."""
        if not self.shadow:
            return all(o.allowed for o in self.outcomes)
        return all(o.allowed or s for o, s in zip(self.outcomes, self.shadow, strict=True))


def shadow_flags(checks: Sequence[Check]) -> tuple[bool, ...]:
    """``Verdict.shadow`` for ``checks``: empty when none is a shadow check."""
    flags = tuple(c.shadow for c in checks)
    return flags if any(flags) else ()


@dataclass(frozen=True, slots=True)
class BlockEntry:
    """A live block as the storage holds it: its key, what is left of it, and its info."""

    key: str
    remaining_us: int
    info: str  # JSON written by ``blocks.py``: reason, who, when


class StorageError(Exception):
    """The backend could not answer (down, slow, out of memory)."""


class _Named(Protocol):
    name: str


S = TypeVar("S", bound=_Named)


def wraps_errors(
    *errors: type[BaseException],
) -> Callable[[Callable[Concatenate[S, P], R]], Callable[Concatenate[S, P], R]]:
    """Decorate a backend method so ``errors`` surface as ``StorageError``.

    The one place a backend's client errors are translated: the fail mode and
    the circuit breaker only ever see ``StorageError``.
    """

    def decorate(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
        @functools.wraps(method)
        def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return method(self, *args, **kwargs)
            except errors as exc:
                raise StorageError(f"{self.name}: {exc}") from exc

        return wrapper

    return decorate


class Storage(Protocol):
    """What every backend implements; ``name`` is its URL scheme."""

    name: str

    def decide(self, checks: Sequence[Check]) -> Verdict:
        """Charge every check if all of them allow; otherwise charge none."""

    def peek(self, checks: Sequence[Check]) -> Verdict:
        """Answer as ``decide`` would without changing anything."""

    def refund(self, checks: Sequence[Check], charged_at_us: int) -> None:
        """Give back each check's ``cost``, charged by ``decide`` at ``charged_at_us``
        (the verdict's ``now_us``). Never gives more than was taken."""

    def charge(self, checks: Sequence[Check]) -> None:
        """Add each check's ``cost`` whether or not it fits: a bucket may go into debt."""

    def clear(self, keys: Sequence[str]) -> None:
        """Forget the state of ``keys`` (a reset)."""

    def block(self, key: str, seconds: int, info: str) -> None:
        """Hold ``info`` at ``key`` for ``seconds``: a ``Gate.BLOCK`` check on it denies."""

    def blocks(self, match: str) -> list[BlockEntry]:
        """Every live block whose key matches the glob ``match`` (an admin listing)."""

    def ping(self) -> float:
        """Round-trip latency in seconds; raises ``StorageError`` when down."""

    def close(self) -> None:
        """Release what the backend holds (connections, memory)."""
