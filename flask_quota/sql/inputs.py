"""Operator input, checked before any change: each problem one ``AdminError`` line.

``QuotaAdmin`` runs every argument through here (the CLI and the dashboard pass
what people typed); the rules themselves are ``core.validators``', whose
``ValueError`` becomes an ``AdminError`` naming the problem.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from ..core import validators
from ..core.networks import ACTIONS, parse_network
from ..core.rates import CREDITS_TEXT
from ..core.tiers import Tier
from .errors import AdminError

__all__ = [
    "DEFAULT_ALGORITHM",
    "algorithm",
    "billing_day",
    "client_name",
    "concurrency",
    "description",
    "lifetime",
    "network",
    "network_action",
    "network_reason",
    "parse_duration",
    "plan_name",
    "positive_id",
    "rate",
    "resource",
    "tenant",
    "tier",
    "unit",
]

T = TypeVar("T")

_DURATION_RE = re.compile(r"(?P<n>[+-]?\d{1,9})\s*(?P<unit>[smhdw])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_MAX_DURATION_DAYS = 3650
# ``set_plan_limit(algorithm=DEFAULT_ALGORITHM)``: the limit follows QUOTA_ALGORITHM again;
# ``unit=DEFAULT_ALGORITHM``: the resource counts the decorator's unit (else requests) again.
DEFAULT_ALGORITHM = "default"
_NO_BOUND = ("", "none", "off")


def parse_duration(text: str) -> timedelta:
    """``"30m"``, ``"12h"``, ``"7d"``, ``"2w"``: a positive span of time, at most
    3650 days (an expiry further out is a typo; leave it out to never expire)."""
    return _span(
        text.strip().lower(), text,
        f"malformed duration {text!r}: use e.g. 30m, 12h, 7d or 2w",
        "leave the expiry out for an override that never expires",
    )  # fmt: skip


def lifetime(text: str) -> timedelta:
    """A rule's lifetime: whole seconds (``"600"``) or a duration (``"10m"``, ``"12h"``,
    ``"7d"``), as ``parse_duration`` bounds it."""
    raw = str(text).strip().lower()
    if raw.isascii() and raw.isdigit() and len(raw) <= 9:
        raw += "s"
    return _span(
        raw, text,
        f"malformed duration {str(text)[:30]!r}: give seconds (600) or e.g. 30m, 12h, 7d",
        "leave it out for a rule that lasts until removed",
    )  # fmt: skip


def _span(raw: str, text: str, malformed: str, forever: str) -> timedelta:
    """``raw`` (a number and a unit) as a span within the bounds of ``parse_duration``;
    ``AdminError`` saying ``malformed``, or, when too long, ``forever``."""
    match = _DURATION_RE.fullmatch(raw)
    if match is None:
        raise AdminError(malformed)
    seconds = int(match.group("n")) * _UNIT_SECONDS[match.group("unit")]
    if seconds <= 0:
        raise AdminError(f"duration {text!r} must be positive")
    if seconds > _MAX_DURATION_DAYS * 86400:
        raise AdminError(
            f"duration {text!r} is longer than {_MAX_DURATION_DAYS} days (about 10 years); "
            f"{forever}"
        )
    return timedelta(seconds=seconds)


def network(text: str) -> str:
    """A network's normalised CIDR text (``10.1.2.3/8`` is ``10.0.0.0/8``; a bare
    address is its /32 or /128)."""
    return str(_checked(parse_network, text))


def network_action(value: str) -> str:
    """``deny`` or ``allow``."""
    action = str(value).strip().lower()
    if action not in ACTIONS:
        raise AdminError(f"a network rule is deny or allow, not {str(value)[:20]!r}")
    return action


_NETWORK_REASON_MAX = 200


def network_reason(value: str | None) -> str:
    """Why a network is denied or allowed: one printable line, at most 200 characters."""
    text = "" if value is None else str(value).strip()
    if len(text) > _NETWORK_REASON_MAX or not text.isprintable():
        raise AdminError(
            f"a network's reason must be at most {_NETWORK_REASON_MAX} printable characters "
            "on one line"
        )
    return text


def _checked(check: Callable[..., T], *args: Any) -> T:
    """Run one of ``validators``' checks; its ``ValueError`` becomes an ``AdminError``."""
    try:
        return check(*args)
    except ValueError as exc:
        raise AdminError(str(exc)) from exc  # the cause tells an interface which hint fits


def plan_name(value: str) -> str:
    return _checked(validators.plan_name, value)


def tier(value: str) -> str:
    return _checked(validators.tier_name, value).value


def resource(tier: str, resource: str | None) -> str:
    return _checked(validators.tier_resource, tier, resource)[1]


def rate(text: str, tier: str | None = None) -> str:
    """A rate's canonical text; ``"credits"`` (a prepaid balance) for a resource only."""
    found = _checked(validators.rate_text, text)
    if found == CREDITS_TEXT and tier is not None and tier != Tier.ENDPOINT.value:
        raise AdminError(
            f"the {tier} tier cannot be 'credits': a prepaid balance is a resource's "
            "(the endpoint tier, with --resource)"
        )
    return found


def algorithm(value: str | None) -> str | None:
    """An algorithm's name, or None for ``"default"`` or ``""`` (``QUOTA_ALGORITHM``) and None."""
    if value is None or value.strip().lower() in (DEFAULT_ALGORITHM, ""):
        return None
    try:
        return validators.algorithm(value.strip().lower()).value
    except ValueError:
        choices = f"{validators.ALGORITHM_NAMES}, {DEFAULT_ALGORITHM}"
        raise AdminError(f"unknown algorithm {value!r}: use one of {choices}") from None


def unit(tier: str, value: str) -> str | None:
    """A resource's unit, or None for ``"default"`` or ``""`` (the decorator's, else
    requests). Only the endpoint tier has one: the others count requests."""
    text = value.strip()
    if text.lower() in (DEFAULT_ALGORITHM, ""):
        return None
    if tier != "endpoint":
        raise AdminError(
            f"the {tier} tier counts requests: a unit belongs to an endpoint tier's resource"
        )
    return _checked(validators.unit_name, text)


def concurrency(value: int | str | None) -> int | None:
    """How many requests of one caller may be in flight at once, or None (``""``,
    ``none``, ``off``) for no bound."""
    if value is None or str(value).strip().lower() in _NO_BOUND:
        return None
    text = str(value).strip()
    # Digits only (no "1.5", "+2", "1e3"); nine at most keeps it an ordinary integer.
    if not isinstance(value, bool) and text.isascii() and text.isdigit() and len(text) <= 9:
        number = int(text)
        if 1 <= number <= validators.MAX_SLOTS:
            return number
    raise AdminError(
        f"concurrent {value!r} must be a whole number of at least 1 and at most "
        f"{validators.MAX_SLOTS:,}, or none for no bound"
    )


_DESCRIPTION_MAX = 500


def description(value: str) -> str:
    text = str(value).strip()
    if len(text) > _DESCRIPTION_MAX or not text.isprintable():
        raise AdminError(
            f"a plan description must be at most {_DESCRIPTION_MAX} printable characters "
            "on one line"
        )
    return text


def client_name(name: str) -> str:
    return _checked(validators.client_name, name)


def tenant(value: str | None) -> str | None:
    """A tenant, or None for "no tenant"."""
    return None if value is None else _checked(validators.tenant_name, value)


def billing_day(value: int | str | None) -> int | None:
    """A day of the month (1-31), or None for ``QUOTA_BILLING_DAY``."""
    return None if value is None else _checked(validators.billing_day, value)


def positive_id(value: int | str, what: str) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise AdminError(f"{what} must be a positive integer, got {value!r}") from None
    if number <= 0:
        raise AdminError(f"{what} must be a positive integer, got {value!r}")
    return number
