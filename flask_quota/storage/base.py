"""What every backend implements, and the values that cross the boundary."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Concatenate, ParamSpec, Protocol, TypeVar

# The values that cross the boundary are the core's; they are named here too, where
# a backend's author looks for them.
from ..core.checks import (
    Check,
    Verdict,
    flat_reply,
    keyed,
    shadow_flags,
    shown_limit,
    verdict_of,
)
from ..core.clock import Clock, wall_clock_us
from ..core.reply import Reply

__all__ = [
    "BlockEntry",
    "Check",
    "Clock",
    "Reply",
    "Storage",
    "StorageError",
    "Verdict",
    "flat_decide",
    "flat_reply",
    "keyed",
    "shadow_flags",
    "shown_limit",
    "verdict_of",
    "wall_clock_us",
    "wraps_errors",
]

P = ParamSpec("P")
R = TypeVar("R")


def flat_decide(storage: Storage, checks: Sequence[Check], keys: Sequence[str]) -> Reply:
    """The request path's storage call: ``checks`` decided on ``keys`` (the checks' own
    keys are ignored), answered as a flat ``Reply``.

    ``checks`` is a request shape reused across requests, so a backend's own
    ``decide_flat`` may cache its encoding by identity. The storage is asked
    through ``decide`` instead when its ``decide_flat`` would skip a ``decide`` of
    its own: a backend without one (Cluster, whose per-slot calls need the
    ``Check`` objects), a subclass that overrides ``decide`` (an app's logging or
    fault injection) or a ``decide`` set on the instance (a test's spy).
    """
    fast = getattr(storage, "decide_flat", None)
    if fast is not None and _flat_is_decide(type(storage)):
        own = getattr(storage, "__dict__", None)
        if not own or "decide" not in own:
            return fast(checks, keys)  # type: ignore[no-any-return]
    return flat_reply(storage.decide(keyed(checks, keys)))


@functools.lru_cache(maxsize=64)
def _flat_is_decide(cls: type) -> bool:
    """True when ``cls.decide`` is defined where ``cls.decide_flat`` is, or above it:
    then ``decide_flat`` decides exactly as ``decide`` does."""
    flat_owner = next(k for k in cls.__mro__ if "decide_flat" in vars(k))
    decide_owner = next((k for k in cls.__mro__ if "decide" in vars(k)), object)
    return issubclass(flat_owner, decide_owner)


@dataclass(frozen=True, slots=True)
class BlockEntry:
    """A live block as the storage holds it: its key, what is left of it, and its info."""

    key: str
    remaining_us: int
    info: str  # JSON written by ``tools/blocks.py``: reason, who, when


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
        """Charge every check if all of them allow; otherwise charge none.

        A backend may also offer ``decide_flat(checks, keys) -> Reply``, the request
        path's form (see ``flat_decide`` below); one without it is called through
        ``decide``.
        """

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

    def block_info(self, key: str) -> str | None:
        """The ``info`` held at the block ``key``, or ``None`` when it is not blocked."""

    def ping(self) -> float:
        """Round-trip latency in seconds; raises ``StorageError`` when down."""

    def close(self) -> None:
        """Release what the backend holds (connections, memory)."""
