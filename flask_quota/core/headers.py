"""Rate-limit response headers: their names, legacy ``X-RateLimit-*`` and IETF
draft-11, and ``QUOTA_HEADER_NAMES``' renames (``Renamer``): the one home of both.

The values are written by ``core.route.Route.headers`` from a storage reply, the one
implementation (a settled response's too: ``Route.settled_headers``)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from enum import StrEnum
from functools import lru_cache
from typing import Protocol

__all__ = [
    "CONCURRENCY_LIMIT",
    "CONCURRENCY_REMAINING",
    "DELAYED",
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
    "Renamer",
    "apply_headers",
    "header_names",
    "policy_header",
    "printable",
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

    def get(self, key: str, /) -> str | None: ...

    def __setitem__(self, key: str, value: str, /) -> None: ...

    def __delitem__(self, key: str, /) -> None: ...


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
# Seconds a request was held before its view by a limit's ``delay=`` (no IETF field
# exists for it either), with three decimals; absent when it was not held.
DELAYED = "X-RateLimit-Delayed"
# A prepaid balance (a plan's "credits" resource) after the request, and its resource.
CREDITS_BALANCE = "X-Credits-Balance"
CREDITS_RESOURCE = "X-Credits-Resource"
CREDITS = (CREDITS_BALANCE, CREDITS_RESOURCE)
# What QUOTA_HEADER_NAMES may rename: every header we send. A new header joins here.
RENAMEABLE = (*NAMES, RETRY_AFTER, CONCURRENCY_LIMIT, CONCURRENCY_REMAINING, DELAYED, *CREDITS)
# Where a request's WSGI environ holds the app's ``Renamer``, when it renames: an error
# we raise (errors.py) reads it as Werkzeug renders the error, wherever it was raised.
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


@lru_cache(maxsize=1024)
def policy_header(tiers: tuple[tuple[str, int, int], ...]) -> str:
    """``RateLimit-Policy`` for (name, quota, window) of every tier; one per plan and route."""
    return ", ".join(f"{sf_string(name)};q={quota};w={window}" for name, quota, window in tiers)


# Lower-cased: when the response has none of them, appending gives what replacing would.
OURS = frozenset(
    name.lower() for name in (*NAMES, CONCURRENCY_LIMIT, CONCURRENCY_REMAINING, DELAYED, *CREDITS)
)


class Renamer:
    """``QUOTA_HEADER_NAMES``: our headers sent under other names. Every header flask-quota
    writes goes through one (or, renaming nothing, none): on a response, on our errors'
    own responses and on a response an app's error handler made from ours."""

    __slots__ = ("names",)

    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = dict(names)

    def name(self, header: str) -> str:
        """The name ``header`` (one of ``RENAMEABLE``) is sent under."""
        return self.names.get(header, header)

    def pairs(self, pairs: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
        """``pairs`` under their names."""
        return [(self.names.get(k, k), v) for k, v in pairs]

    def rename(self, headers: Headers) -> None:
        """Move our headers that carry their usual names (a response an app built from
        our error) to theirs."""
        for ours, theirs in self.names.items():
            value = headers.get(ours)
            if value is not None and theirs != ours:
                del headers[ours]
                headers[theirs] = value

    @staticmethod
    def retry_after(renamer: Renamer | None) -> str:
        """The name ``Retry-After`` is sent under."""
        return RETRY_AFTER if renamer is None else renamer.name(RETRY_AFTER)


def apply_headers(
    headers: Headers, pairs: list[tuple[str, str]], renamer: Renamer | None = None
) -> None:
    """Set ``pairs`` on ``headers``, replacing any header of the same name, under the
    ``renamer``'s names.

    ``Headers.__setitem__`` scans every header for each name; when none of ours
    is present (the usual case) adding gives the same result in one scan.
    """
    if renamer is not None:  # rare: the scan below knows only the usual names
        for name, value in renamer.pairs(pairs):
            headers[name] = value
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
