"""Rate-limit response headers: legacy ``X-RateLimit-*`` and IETF draft-11."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from enum import StrEnum
from functools import lru_cache
from typing import Protocol

from .clock import ceil_seconds, seconds_until
from .policy import Decision

__all__ = [
    "ENVIRON_KEY",
    "LIMIT",
    "NAMES",
    "OURS",
    "POLICY",
    "RATELIMIT",
    "REMAINING",
    "RENAMEABLE",
    "RESET",
    "RESOURCE",
    "RETRY_AFTER",
    "HeaderMode",
    "apply_headers",
    "header_names",
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
RETRY_AFTER = "Retry-After"  # on our 429s and 503s
# The tightest concurrency limit's slots and free slots (no IETF field exists for them).
CONCURRENCY_LIMIT = "X-Concurrency-Limit"
CONCURRENCY_REMAINING = "X-Concurrency-Remaining"
# What QUOTA_HEADER_NAMES may rename: every header we send. A new header joins here.
RENAMEABLE = (*NAMES, RETRY_AFTER, CONCURRENCY_LIMIT, CONCURRENCY_REMAINING)
# Where a request's WSGI environ holds QUOTA_HEADER_NAMES, when set: an error we raise
# (errors.py) reads it as Werkzeug renders the error, wherever it was raised.
ENVIRON_KEY = "flask_quota.header_names"


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
OURS = frozenset(name.lower() for name in (*NAMES, CONCURRENCY_LIMIT, CONCURRENCY_REMAINING))


def apply_headers(
    headers: Headers, pairs: list[tuple[str, str]], names: Mapping[str, str] | None = None
) -> None:
    """Set ``pairs`` on ``headers``, replacing any header of the same name; ``names``
    (``QUOTA_HEADER_NAMES``) renames them.

    ``Headers.__setitem__`` scans every header for each name; when none of ours
    is present (the usual case) adding gives the same result in one scan.
    """
    if names:  # rare: the scan below knows only the usual names, so always replace
        for name, value in pairs:
            headers[names.get(name, name)] = value
        return
    for name in headers.keys():  # noqa: SIM118 (Headers iterates pairs, not names)
        if name.lower() in OURS:
            break
    else:
        for name, value in pairs:
            headers.add(name, value)
        return
    for name, value in pairs:
        headers[name] = value


# RFC 9110 field names are tokens: no spaces, colons or line breaks.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_CANONICAL = {name.lower(): name for name in RENAMEABLE}
# Headers with a meaning of their own to HTTP or the browser: ours must not overwrite them.
_RESERVED = frozenset(
    ("content-type", "content-length", "content-encoding", "transfer-encoding", "connection",
     "location", "set-cookie", "cache-control", "vary", "date", "www-authenticate")
)  # fmt: skip


def header_names(value: object, key: str = "QUOTA_HEADER_NAMES") -> dict[str, str] | None:
    """``{our header: its new name}`` from a dict (or its JSON), checked; ``None`` when
    nothing is renamed. Our names are matched case-insensitively; raises ``ValueError``
    naming the entry for an unknown header, an invalid name, or two headers sent under
    one name."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{key} is not valid JSON: {exc}") from None
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{key} must be a dict such as {{'X-RateLimit-Limit': 'X-Quota-Limit'}}, got {value!r}"
        )
    renamed: dict[str, str] = {}
    for source, target in value.items():
        ours = _CANONICAL.get(source.lower()) if isinstance(source, str) else None
        if ours is None:
            raise ValueError(
                f"{key}: {source!r} is not a header flask-quota sends; "
                f"rename one of {', '.join(RENAMEABLE)}"
            )
        if ours in renamed:
            raise ValueError(f"{key}: {ours!r} is given twice (header names ignore case)")
        where = f"{key}[{source!r}]={target!r}"
        if isinstance(target, str) and ("\r" in target or "\n" in target):
            raise ValueError(f"{where} holds a line break, which would split the response")
        if not isinstance(target, str) or not _TOKEN.fullmatch(target):
            raise ValueError(
                f"{where} is not a valid header name: use letters, digits and '-', "
                "e.g. 'X-Quota-Limit'"
            )
        if target.lower() in _RESERVED:
            raise ValueError(f"{where} would overwrite the response's own {target} header")
        renamed[ours] = target
    sent: dict[str, str] = {}  # lower-cased name on the wire -> our header sent under it
    for ours in RENAMEABLE:
        wire = renamed.get(ours, ours).lower()
        other = sent.setdefault(wire, ours)
        if other != ours:
            raise ValueError(
                f"{key}: {other!r} and {ours!r} would both be sent as "
                f"{renamed.get(ours, ours)!r}; give each header its own name"
            )
    return {ours: new for ours, new in renamed.items() if new != ours} or None
