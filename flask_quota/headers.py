"""Rate-limit response headers: legacy ``X-RateLimit-*`` and IETF draft-11."""

from __future__ import annotations

from functools import lru_cache

from werkzeug.datastructures import Headers

from .clock import ceil_seconds
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
    shown: TierResult | None = decision.denied or decision.closest
    if shown is None or mode is HeaderMode.NONE:
        return []
    outcome = shown.outcome
    headers: list[tuple[str, str]] = []
    if mode in (HeaderMode.LEGACY, HeaderMode.BOTH):
        headers += [
            ("X-RateLimit-Limit", str(outcome.limit)),
            ("X-RateLimit-Remaining", str(max(0, outcome.remaining))),
            ("X-RateLimit-Reset", str(ceil_seconds(outcome.reset_us))),
            ("X-RateLimit-Resource", _printable(shown.name)),
        ]
    if mode in (HeaderMode.IETF, HeaderMode.BOTH):
        policies = _policy(
            tuple((r.name, r.outcome.limit, r.rate.policy_window) for r in decision.enforced)
        )
        reset_in = decision.seconds_until(outcome.reset_us)
        headers += [
            ("RateLimit-Policy", policies),
            ("RateLimit", f"{sf_string(shown.name)};r={max(0, outcome.remaining)};t={reset_in}"),
        ]
    return headers


@lru_cache(maxsize=1024)
def _policy(tiers: tuple[tuple[str, int, int], ...]) -> str:
    """``RateLimit-Policy`` for (name, quota, window) of every tier; one per plan and route."""
    return ", ".join(f"{sf_string(name)};q={quota};w={window}" for name, quota, window in tiers)


def apply_headers(headers: Headers, pairs: list[tuple[str, str]]) -> None:
    """Set ``pairs`` on ``headers``, replacing any header of the same name.

    ``Headers.__setitem__`` scans every header for each name; when none of ours
    is present (the usual case) appending gives the same result in one scan.
    """
    present = {name.lower() for name, _ in headers.items()}
    if not any(name.lower() in present for name, _ in pairs):
        # Every value is printable ASCII we built (numbers, sf-strings, _printable
        # names), so Werkzeug's per-value validation can be skipped: it cost ~1 us a header.
        raw = getattr(headers, "_list", None)
        if isinstance(raw, list):
            raw.extend(pairs)
        else:
            for name, value in pairs:
                headers.add(name, value)
    else:
        for name, value in pairs:
            headers[name] = value
