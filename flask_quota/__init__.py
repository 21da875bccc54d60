"""flask-quota: exact, tiered, one-round-trip rate limiting for Flask APIs."""

from __future__ import annotations

from .algorithms import Algorithm
from .errors import CallerBlocked, InvalidApiKey, QuotaExceeded, QuotaUnavailable
from .extension import Quota
from .identity import Identity
from .plans import Plan, PlanCatalog
from .rates import Rate, parse_rate
from .tiers import Tier

__all__ = [
    "Algorithm",
    "CallerBlocked",
    "Identity",
    "InvalidApiKey",
    "Plan",
    "PlanCatalog",
    "Quota",
    "QuotaExceeded",
    "QuotaUnavailable",
    "Rate",
    "Tier",
    "parse_rate",
]
