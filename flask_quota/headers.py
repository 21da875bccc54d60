"""Rate-limit response headers: legacy ``X-RateLimit-*`` and IETF draft-11."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

from werkzeug.datastructures import Headers

from .clock import US, ceil_seconds, seconds_until
from .policy import Decision, TierResult
from .settings import HeaderMode

if TYPE_CHECKING:
    from .route import Route

__all__ = [
    "apply_headers",
    "policy_header",
    "printable",
    "rate_limit_headers",
    "reply_headers",
    "sf_string",
]


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
    results = decision.enforced
    if not results or mode is HeaderMode.NONE:
        return []
    shown = _shown(results)
    outcome = shown.outcome
    remaining = str(max(0, outcome.remaining))
    if mode is HeaderMode.IETF:
        headers: list[tuple[str, str]] = []
    else:
        headers = [
            ("X-RateLimit-Limit", str(outcome.limit)),
            ("X-RateLimit-Remaining", remaining),
            ("X-RateLimit-Reset", str(ceil_seconds(outcome.reset_us))),
            ("X-RateLimit-Resource", printable(shown.name)),
        ]
        if mode is HeaderMode.LEGACY:
            return headers
    policies = policy_header(
        tuple([(r.name, r.outcome.limit, r.rate.policy_window) for r in results])
    )
    reset_in = seconds_until(outcome.reset_us, decision.now_us)
    headers.append(("RateLimit-Policy", policies))
    headers.append(("RateLimit", f"{sf_string(shown.name)};r={remaining};t={reset_in}"))
    return headers


def reply_headers(route: Route, reply: Sequence[int], mode: HeaderMode) -> list[tuple[str, str]]:
    """``rate_limit_headers`` of ``route.decision(reply)``, byte for byte, read straight
    off the storage's flat reply (tier ``i`` at ``reply[6 + 4 * i:]``, after the gate)."""
    enforced = route.enforced
    if not enforced or mode is HeaderMode.NONE:
        return []
    shown = -1  # as _shown: the first denial with the longest wait, else the fewest remaining
    if not reply[1]:  # some check denied (all_allowed covers every enforced tier)
        for i in enforced:
            j = 6 + 4 * i
            if not reply[j] and (shown < 0 or reply[j + 3] > reply[9 + 4 * shown]):
                shown = i
    if shown < 0:
        shown = enforced[0]
        fewest, latest = reply[7 + 4 * shown], reply[8 + 4 * shown]
        for i in enforced:
            left, reset = reply[7 + 4 * i], reply[8 + 4 * i]
            if left < fewest or (left == fewest and reset > latest):
                shown, fewest, latest = i, left, reset
    remaining = str(max(0, reply[7 + 4 * shown]))
    reset_us = reply[8 + 4 * shown]
    if mode is HeaderMode.IETF:
        headers: list[tuple[str, str]] = []
    else:
        headers = [
            ("X-RateLimit-Limit", route.limit_texts[shown]),
            ("X-RateLimit-Remaining", remaining),
            ("X-RateLimit-Reset", str(-(-reset_us // US))),
            ("X-RateLimit-Resource", route.names[shown]),
        ]
        if mode is HeaderMode.LEGACY:
            return headers
    reset_in = max(0, -(-(reset_us - reply[0]) // US))  # seconds_until, inlined
    headers.append(("RateLimit-Policy", route.policy))
    headers.append(("RateLimit", f"{route.labels[shown]};r={remaining};t={reset_in}"))
    return headers


def _shown(results: tuple[TierResult, ...]) -> TierResult:
    """``decision.denied or decision.closest`` in one pass, ties resolved as they do:
    the first denial with the longest wait, else the first with the fewest remaining
    and, among those, the latest reset."""
    denied: TierResult | None = None
    for r in results:
        o = r.outcome
        if not o.allowed and (denied is None or o.retry_after_us > denied.outcome.retry_after_us):
            denied = r
    if denied is not None:
        return denied
    shown = results[0]
    fewest, latest = shown.outcome.remaining, shown.outcome.reset_us
    for r in results:
        o = r.outcome
        if o.remaining < fewest or (o.remaining == fewest and o.reset_us > latest):
            shown, fewest, latest = r, o.remaining, o.reset_us
    return shown


@lru_cache(maxsize=1024)
def policy_header(tiers: tuple[tuple[str, int, int], ...]) -> str:
    """``RateLimit-Policy`` for (name, quota, window) of every tier; one per plan and route."""
    return ", ".join(f"{sf_string(name)};q={quota};w={window}" for name, quota, window in tiers)


# Every header name this module writes, lower-cased: when the response has none of
# them, appending gives what replacing would.
_OURS = frozenset(
    name.lower()
    for name in (
        "X-RateLimit-Limit",
        "X-RateLimit-Remaining",
        "X-RateLimit-Reset",
        "X-RateLimit-Resource",
        "RateLimit-Policy",
        "RateLimit",
    )
)


def apply_headers(headers: Headers, pairs: list[tuple[str, str]]) -> None:
    """Set ``pairs`` on ``headers``, replacing any header of the same name.

    ``Headers.__setitem__`` scans every header for each name; when none of ours
    is present (the usual case) appending gives the same result in one scan.
    """
    raw = getattr(headers, "_list", None)
    if not isinstance(raw, list):
        raw = list(headers.items())
        fast = None
    else:
        fast = raw
    for name, _ in raw:
        if name.lower() in _OURS:
            break
    else:
        # Every value is printable ASCII we built (numbers, sf-strings, printable
        # names), so Werkzeug's per-value validation can be skipped: it cost ~1 us a header.
        if fast is not None:
            fast.extend(pairs)
        else:
            for name, value in pairs:
                headers.add(name, value)
        return
    for name, value in pairs:
        headers[name] = value
