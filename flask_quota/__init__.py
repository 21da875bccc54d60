"""flask-quota: exact, tiered, one-round-trip rate limiting for Flask APIs."""

from __future__ import annotations

from .core.algorithms import Algorithm
from .core.errors import (
    CallerBlocked,
    CreditsExhausted,
    InvalidApiKey,
    NetworkDenied,
    QuotaExceeded,
    QuotaUnavailable,
)
from .core.identity import Identity
from .core.plans import Plan, PlanCatalog
from .core.rates import Rate, parse_rate
from .core.tiers import Tier
from .extension import Quota

__all__ = [
    "Algorithm",
    "CallerBlocked",
    "CreditsExhausted",
    "Identity",
    "InvalidApiKey",
    "NetworkDenied",
    "Plan",
    "PlanCatalog",
    "Quota",
    "QuotaExceeded",
    "QuotaUnavailable",
    "Rate",
    "Tier",
    "parse_rate",
]
