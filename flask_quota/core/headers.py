"""Rate-limit response headers: legacy ``X-RateLimit-*`` and IETF draft-11."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from functools import lru_cache
from typing import Protocol

from .clock import ceil_seconds, seconds_until
from .policy import Decision

__all__ = [
    "LIMIT",
    "NAMES",
    "POLICY",
    "RATELIMIT",
    "REMAINING",
    "RESET",
    "RESOURCE",
    "HeaderMode",
    "apply_headers",
    "policy_header",
    "printable",
    "rate_limit_headers",
    "sf_string",
]


class HeaderMode(StrEnum):
    """Which rate-limit headers to send (``QUOTA_HEADERS``)."""

    LEGACY = "legacy"
    IETF = "ietf"
    BOTH = "both"
    NONE = "none"


class Headers(Protocol):
    """What ``apply_headers`` needs of a response's headers (Werkzeug's ``Headers``)."""

    def keys(self) -> Iterable[str]: ...

    def add(self, key: str, value: str, /) -> None: ...

    def __setitem__(self, key: str, value: str, /) -> None: ...


# Every header this library writes, in the order it writes them: legacy, then IETF.
LIMIT = "X-RateLimit-Limit"
REMAINING = "X-RateLimit-Remaining"
RESET = "X-RateLimit-Reset"
RESOURCE = "X-RateLimit-Resource"
POLICY = "RateLimit-Policy"
RATELIMIT = "RateLimit"
NAMES = (LIMIT, REMAINING, RESET, RESOURCE, POLICY, RATELIMIT)


# Names are tier and resource names, a small fixed set per app: the escaped forms
# are cached (escaping them on every request was a quarter of the after-request cost).
@lru_cache(maxsize=1024)
def sf_string(value: str) -> str:
    """An RFC 8941 sf-string: printable ASCII, quotes and backslashes escaped."""
    text = printable(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@lru_cache(maxsize=1024)
def printable(value: str) -> str:
    """Printable ASCII only: an endpoint name is the app's, but a header must stay valid."""
    return "".join(c if " " <= c <= "~" else "?" for c in value)


def rate_limit_headers(decision: Decision, mode: HeaderMode) -> list[tuple[str, str]]:
    """Headers for the tier that matters: the denying one, else the closest to its limit.

    Shadow tiers are left out: they never deny, so a client has nothing to act on.
    """
    results = decision.rated
    if not results or mode is HeaderMode.NONE:
        return []
    shown = decision.shown
    assert shown is not None  # there are enforced results
    outcome = shown.outcome
    remaining = str(max(0, outcome.remaining))
    if mode is HeaderMode.IETF:
        headers: list[tuple[str, str]] = []
    else:
        headers = [
            (LIMIT, str(outcome.limit)),
            (REMAINING, remaining),
            (RESET, str(ceil_seconds(outcome.reset_us))),
            (RESOURCE, printable(shown.name)),
        ]
        if mode is HeaderMode.LEGACY:
            return headers
    policies = policy_header(
        tuple([(r.name, r.outcome.limit, r.rate.policy_window) for r in results])
    )
    reset_in = seconds_until(outcome.reset_us, decision.now_us)
    headers.append((POLICY, policies))
    headers.append((RATELIMIT, f"{sf_string(shown.name)};r={remaining};t={reset_in}"))
    return headers


@lru_cache(maxsize=1024)
def policy_header(tiers: tuple[tuple[str, int, int], ...]) -> str:
    """``RateLimit-Policy`` for (name, quota, window) of every tier; one per plan and route."""
    return ", ".join(f"{sf_string(name)};q={quota};w={window}" for name, quota, window in tiers)


# Lower-cased: when the response has none of them, appending gives what replacing would.
_OURS = frozenset(name.lower() for name in NAMES)


def apply_headers(headers: Headers, pairs: list[tuple[str, str]]) -> None:
    """Set ``pairs`` on ``headers``, replacing any header of the same name.

    ``Headers.__setitem__`` scans every header for each name; when none of ours
    is present (the usual case) adding gives the same result in one scan.
    """
    for name in headers.keys():  # noqa: SIM118 (Headers iterates pairs, not names)
        if name.lower() in _OURS:
            break
    else:
        for name, value in pairs:
            headers.add(name, value)
        return
    for name, value in pairs:
        headers[name] = value
