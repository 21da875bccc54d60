"""What every backend implements, and the values that cross the boundary."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ParamSpec, Protocol, TypeVar

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
    "storage_errors",
    "verdict_of",
    "wall_clock_us",
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
    cls = type(storage)
    flat = _FLAT_IS_DECIDE.get(cls)  # a dict read: this runs once or twice per request
    if flat is None:
        flat = _flat_is_decide(cls)
    if flat:
        own = getattr(storage, "__dict__", None)
        if not own or "decide" not in own:
            return storage.decide_flat(checks, keys)  # type: ignore[attr-defined,no-any-return]
    return flat_reply(storage.decide(keyed(checks, keys)))


_FLAT_IS_DECIDE: dict[type, bool] = {}  # ``_flat_is_decide``'s answers, at most 64


def _flat_is_decide(cls: type) -> bool:
    """True when ``cls`` has a ``decide_flat`` and its ``decide`` is defined where
    ``decide_flat`` is, or above it: then ``decide_flat`` decides exactly as ``decide``
    does. Kept in ``_FLAT_IS_DECIDE``."""
    flat_owner = next((k for k in cls.__mro__ if "decide_flat" in vars(k)), None)
    decide_owner = next((k for k in cls.__mro__ if "decide" in vars(k)), object)
    found = flat_owner is not None and issubclass(flat_owner, decide_owner)
    if len(_FLAT_IS_DECIDE) >= 64:
        _FLAT_IS_DECIDE.clear()
    _FLAT_IS_DECIDE[cls] = found
    return found


@dataclass(frozen=True, slots=True)
class BlockEntry:
    """A live block as the storage holds it: its key, what is left of it, and its info."""

    key: str
    remaining_us: int
    info: str  # JSON written by ``tools/blocks.py``: reason, who, when


class StorageError(Exception):
    """The backend could not answer (down, slow, out of memory)."""


C = TypeVar("C", bound=type)


def storage_errors(*errors: type[BaseException]) -> Callable[[C], C]:
    """Declare what a backend's client raises when it cannot answer: every public
    method of the decorated class then raises ``StorageError`` instead.

    The one place client errors are translated, for every backend and usage sink:
    the fail mode, the circuit breaker, the CLI and the dashboard only ever see
    ``StorageError``. Methods are wrapped by what the class itself defines
    (``vars``), so a subclass inherits wrapped methods and decorates its own; a
    backend with no client (memory) declares none and keeps its methods as they are.
    A class attribute ``name`` (the URL scheme) starts each message.
    """

    def decorate(cls: C) -> C:
        if errors:
            for attr, value in list(vars(cls).items()):
                if not attr.startswith("_") and inspect.isfunction(value):
                    setattr(cls, attr, _translated(value, errors))
        cls.storage_errors = errors  # type: ignore[attr-defined]  # read by the layout tests
        return cls

    return decorate


def _translated(method: Callable[P, R], errors: tuple[type[BaseException], ...]) -> Callable[P, R]:
    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(*args, **kwargs)
        except errors as exc:
            raise StorageError(f"{args[0].name}: {exc}") from exc  # type: ignore[attr-defined]

    wrapper.storage_errors = errors  # type: ignore[attr-defined]  # read by the layout tests
    return wrapper


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

    def claim(self, key: str, seconds: int) -> bool:
        """Hold ``key`` for ``seconds`` if nobody holds it: True for the one caller, of all
        the workers sharing the storage, that took it (an alert told once per period)."""

    def holders(self, key: str) -> list[str]:
        """The live members of the lease set ``key`` (an operator's view: a concurrency
        limit's or the fleet capacity's requests in flight)."""

    def ping(self) -> float:
        """Round-trip latency in seconds; raises ``StorageError`` when down."""

    def close(self) -> None:
        """Release what the backend holds (connections, memory)."""
