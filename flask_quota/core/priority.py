"""Priority classes and the service's capacity: which requests are shed first.

Every request has a class, ``critical`` > ``default`` > ``sheddable`` (``QUOTA_PRIORITY``,
``@quota.limit(priority=...)``, ``@quota.priority(...)``; none: ``default``). A capacity
(``QUOTA_CAPACITY``, or the adaptive one) is shared out by ``QUOTA_RESERVE``: the
share of it each class leaves to the classes above it. With ``{"critical": 0.2,
"default": 0.1}`` and a capacity of 100, a critical request is admitted while fewer
than 100 requests are in flight, a default one while fewer than 90, a sheddable one
while fewer than 70. As load grows, sheddable requests are refused first, then default
ones, critical ones last, and no class is refused while a lower one is admitted: a
lower class's line is never above a higher one's.

Pure functions, no clock: the request edge and the enforcer ask them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from enum import StrEnum

__all__ = [
    "DEFAULT_RESERVE",
    "Priority",
    "class_limits",
    "parse_priority",
    "parse_reserve",
    "queued_us",
]


class Priority(StrEnum):
    """A request's class, most important first."""

    CRITICAL = "critical"
    DEFAULT = "default"
    SHEDDABLE = "sheddable"


ORDER = (Priority.CRITICAL, Priority.DEFAULT, Priority.SHEDDABLE)
DEFAULT_RESERVE: dict[str, float] = {"critical": 0.2, "default": 0.1}


def parse_priority(value: object, where: str = "priority") -> Priority:
    """A class, from its name (or itself); ``ValueError`` naming the three otherwise."""
    if isinstance(value, Priority):
        return value
    try:
        if not isinstance(value, str):
            raise ValueError(value)
        return Priority(value.strip().lower())
    except ValueError:
        raise ValueError(
            f"{where}={value!r} is not a priority; use 'critical', 'default' or 'sheddable'"
        ) from None


def parse_reserve(value: object, key: str = "QUOTA_RESERVE") -> dict[Priority, float]:
    """``QUOTA_RESERVE`` checked: the share of the capacity each class keeps for the
    classes above it (``critical``: for nobody else; ``default``: for critical), shares
    from 0 to 1 that leave sheddable requests some room (they sum below 1)."""
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{key} is not valid JSON: {exc}") from None
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{key} must be a dict such as {{'critical': 0.2, 'default': 0.1}}, got {value!r}"
        )
    found: dict[Priority, float] = {Priority.CRITICAL: 0.0, Priority.DEFAULT: 0.0}
    for name, share in value.items():
        cls = parse_priority(name, f"{key} key")
        if cls is Priority.SHEDDABLE:
            raise ValueError(
                f"{key}: 'sheddable' keeps nothing for a class above it (there is none "
                "below it); name 'critical' and 'default' only"
            )
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share < 1:
            raise ValueError(f"{key}[{name!r}]={share!r} must be a share from 0 to below 1")
        found[cls] = float(share)
    if found[Priority.CRITICAL] + found[Priority.DEFAULT] >= 1:
        raise ValueError(
            f"{key}: the shares sum to {sum(found.values()):g}, leaving sheddable requests "
            "no room at all; keep their sum below 1"
        )
    return found


def class_limits(capacity: int, reserve: Mapping[Priority, float]) -> dict[Priority, int]:
    """The requests in flight below which each class is admitted: critical the whole
    capacity, default all but the critical reserve, sheddable all but both. Each at
    least 1, and never above a higher class's."""
    critical = reserve.get(Priority.CRITICAL, 0.0)
    default = reserve.get(Priority.DEFAULT, 0.0)
    top = max(1, capacity)
    middle = max(1, math.floor(top * (1 - critical) + 1e-9))
    low = max(1, math.floor(top * (1 - critical - default) + 1e-9))
    return {Priority.CRITICAL: top, Priority.DEFAULT: middle, Priority.SHEDDABLE: min(low, middle)}


# X-Request-Start as the common proxies write it: nginx "t=1700000000.123" (seconds with
# milliseconds), New Relic style "t=1700000000123456" (microseconds), Heroku and others
# "1700000000123" (milliseconds).
_REQUEST_START = re.compile(r"\s*(?:t=)?([0-9]{9,17})(?:\.([0-9]{1,6}))?\s*")


def queued_us(header: str | None, now_us: int) -> int | None:
    """How long a request waited before reaching the app, by its ``X-Request-Start``
    header (None when absent or not in a known form). A whole number is read by its
    size: seconds, milliseconds or microseconds since the epoch."""
    if not header:
        return None
    found = _REQUEST_START.fullmatch(header)
    if found is None:
        return None
    whole, fraction = found[1], found[2]
    if fraction is not None:  # seconds with a fraction (nginx's $msec)
        start = int(whole) * 1_000_000 + int(fraction.ljust(6, "0"))
    else:
        number = int(whole)
        if number >= 10**15:
            start = number  # microseconds
        elif number >= 10**12:
            start = number * 1000  # milliseconds
        else:
            start = number * 1_000_000  # seconds
    return max(0, now_us - start)
