"""Rate-limit response headers: legacy ``X-RateLimit-*`` and IETF draft-11."""

from __future__ import annotations

from functools import lru_cache

from werkzeug.datastructures import Headers

from .clock import ceil_seconds, seconds_until
from .policy import Decision, TierResult
from .settings import HeaderMode

__all__ = ["apply_headers", "rate_limit_headers", "sf_string"]


# Names are tier and resource names, a small fixed set per app: the escaped forms
# are cached (escaping them on every request was a quarter of the after-request cost).
@lru_cache(maxsize=1024)
def sf_string(value: str) -> str:
    """An RFC 8941 sf-string: printable ASCII, quotes and backslashes escaped."""
    text = _printable(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


@lru_cache(maxsize=1024)
def _printable(value: str) -> str:
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
            ("X-RateLimit-Resource", _printable(shown.name)),
        ]
        if mode is HeaderMode.LEGACY:
            return headers
    policies = _policy(tuple([(r.name, r.outcome.limit, r.rate.policy_window) for r in results]))
    reset_in = seconds_until(outcome.reset_us, decision.now_us)
    headers.append(("RateLimit-Policy", policies))
    headers.append(("RateLimit", f"{sf_string(shown.name)};r={remaining};t={reset_in}"))
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
def _policy(tiers: tuple[tuple[str, int, int], ...]) -> str:
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
        # Every value is printable ASCII we built (numbers, sf-strings, _printable
        # names), so Werkzeug's per-value validation can be skipped: it cost ~1 us a header.
        if fast is not None:
            fast.extend(pairs)
        else:
            for name, value in pairs:
                headers.add(name, value)
        return
    for name, value in pairs:
        headers[name] = value
