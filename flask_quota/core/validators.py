"""The one home of the rules for names users type: tiers, resources, plans, clients, rates.

The decorator, ``QUOTA_PLANS``, the SQL models, the admin API, the CLI and the
dashboard all validate through these functions, so a name accepted in one
place is accepted everywhere. Each raises ``ValueError`` with a message that
says what is accepted.
"""

from __future__ import annotations

import re

from .algorithms import Algorithm
from .rates import Rate, Rates, parse_rates
from .tiers import Tier

__all__ = [
    "ALGORITHM_NAMES",
    "DEFAULT_UNIT",
    "RESOURCE_PATTERN",
    "RESOURCE_RE",
    "algorithm",
    "client_name",
    "concurrency",
    "is_count",
    "plan_name",
    "rate_text",
    "resource_name",
    "tier_name",
    "tier_resource",
    "unit_name",
]

RESOURCE_PATTERN = r"[A-Za-z0-9_.\-]{1,64}"
RESOURCE_RE = re.compile(RESOURCE_PATTERN)
_RESOURCE_RULE = "1-64 characters of A-Z a-z 0-9 _ . -"


ALGORITHM_NAMES = ", ".join(a.value for a in Algorithm)


def algorithm(value: str) -> Algorithm:
    """An algorithm by its name (``token_bucket``, ...), exactly as ``Algorithm`` spells it."""
    try:
        return Algorithm(value)
    except ValueError:
        raise ValueError(f"unknown algorithm {value!r}: use one of {ALGORITHM_NAMES}") from None


def is_count(value: object, *, minimum: int = 0) -> bool:
    """True for an int (not a bool) of at least ``minimum``: costs, charges, seconds."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


# The most requests in flight a concurrency limit may allow: far beyond any server's
# (GitHub allows 100), and a lease's count stays an ordinary rate whatever
# QUOTA_LEASE_SECONDS is (at least 1 s: 100,000 per second).
MAX_SLOTS = 100_000


def concurrency(value: object) -> int:
    """How many requests of one caller may be in flight at once: a whole number from 1
    to ``MAX_SLOTS``."""
    if not is_count(value, minimum=1) or value > MAX_SLOTS:  # type: ignore[operator]
        raise ValueError(
            f"{value!r} is not a number of requests in flight: use a whole number of at "
            f"least 1 and at most {MAX_SLOTS:,}"
        )
    assert isinstance(value, int)
    return value


def tier_name(value: str) -> Tier:
    """``"global"``, ``"tenant"``, ``"user"`` or ``"endpoint"`` (any case, blanks ignored)."""
    try:
        tier = Tier(str(value).strip().lower())
    except ValueError:
        tier = None
    if tier is None or tier is Tier.CONCURRENT:  # no rate: a plan's "concurrent" is a number
        raise ValueError(f"unknown tier {value!r}: use global, tenant, user or endpoint")
    return tier


def resource_name(value: object) -> str:
    """A resource name as ``@quota.limit(resource=...)`` and plans accept it."""
    if not isinstance(value, str) or not RESOURCE_RE.fullmatch(value):
        raise ValueError(f"resource {value!r} must be {_RESOURCE_RULE}")
    return value


_PLAN_RE = re.compile(RESOURCE_PATTERN)
_PLAN_RULE = (
    "1-64 printable characters of A-Z a-z 0-9 _ . - (not '.' or '..'): a plan name is "
    "part of the dashboard's URLs, where '/', '.' segments and other characters would be "
    "rewritten"
)


def plan_name(value: object) -> str:
    """A plan name: 1-64 of A-Z a-z 0-9 ``_ . -``, and neither ``.`` nor ``..``.

    Plan names are path segments of the dashboard's URLs: a browser resolves ``.``
    and ``..`` segments and a ``/`` starts another segment, so such a name would edit
    (or delete) another plan. Names stored by an earlier release are still served.
    """
    if not isinstance(value, str) or not _PLAN_RE.fullmatch(value) or value in (".", ".."):
        raise ValueError(f"plan name {value!r} must be {_PLAN_RULE}")
    return value


DEFAULT_UNIT = "requests"  # what a resource counts when nothing names its unit
UNIT_MAX = 32
_UNIT_RE = re.compile(r"[a-z]+(?: [a-z]+)*")
_UNIT_RULE = (
    f"1-{UNIT_MAX} characters: lowercase words of a-z, one space between them, "
    "e.g. tokens, credits, bytes"
)


def unit_name(value: object) -> str:
    """What a resource counts, as its 429 detail, the CLI and the dashboard say it:
    ``"2000 tokens per 3600 s"``. Short lowercase words, so it reads inside a sentence."""
    if not isinstance(value, str) or len(value) > UNIT_MAX or not _UNIT_RE.fullmatch(value):
        raise ValueError(f"unit {value!r} must be {_UNIT_RULE}")
    return value


def client_name(value: str) -> str:
    """A client's display name: 1-200 printable characters, blanks trimmed."""
    name = str(value).strip()
    if not name or len(name) > 200 or not name.isprintable():
        raise ValueError("a client name must be 1-200 printable characters")
    return name


TENANT_MAX = 64


def tenant_name(value: object) -> str:
    """A tenant as clients and overrides store it: 1-64 printable characters, blanks
    trimmed (it is escaped into storage keys, so any such text is safe there)."""
    name = value.strip() if isinstance(value, str) else ""
    if not name or len(name) > TENANT_MAX or not name.isprintable():
        raise ValueError(f"a tenant must be 1-{TENANT_MAX} printable characters, got {value!r}")
    return name


def billing_day(value: object) -> int:
    """A day of the month a client's ``N/month`` quotas reset on: 1-31 (29-31 mean the
    last day of shorter months)."""
    text = str(value).strip()
    if isinstance(value, bool) or not text.isascii() or not text.isdigit() or len(text) > 2:
        raise ValueError(f"a billing day must be a day of the month from 1 to 31, got {value!r}")
    day = int(text)
    if not 1 <= day <= 31:
        raise ValueError(f"a billing day must be a day of the month from 1 to 31, got {value!r}")
    return day


def rate_text(value: str | Rate | Rates) -> str:
    """Rates in their canonical text form (``"5/minute"``, ``"2/second, 3/minute"``),
    parsed to prove they are valid."""
    return str(parse_rates(value))


class ResourceError(ValueError):
    """A resource given where the tier takes none, or missing where it needs one
    (``needed``); the text names no form field, so each interface adds its own hint."""

    def __init__(self, message: str, *, needed: bool) -> None:
        super().__init__(message)
        self.needed = needed


def tier_resource(tier: str, resource: str | None) -> tuple[Tier, str]:
    """A tier and its resource as plan limits and overrides store them.

    The endpoint tier names a resource; global, tenant and user cover every resource
    and store ``""``.
    """
    parsed = tier_name(tier)
    if parsed is Tier.ENDPOINT:
        if not resource:
            raise ResourceError(
                "the endpoint tier needs a resource, e.g. ai_inference", needed=True
            )
        return parsed, resource_name(resource)
    if resource:
        raise ResourceError(
            f"the {parsed.value} tier covers every resource; give none", needed=False
        )
    return parsed, ""
