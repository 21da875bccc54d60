"""The tiers every request is checked against."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["RATE_TIERS", "Tier"]


class Tier(StrEnum):
    """The tiers a request is checked against, in this order."""

    GLOBAL = "global"  # per client IP: the first wall against floods
    # Per ``Identity.tenant``, shared by every caller of one customer org. It sits between
    # global and user: wider than a caller's own bucket, so when both are full the
    # tenant's is the one worth naming (and an org's neighbours are stopped first).
    TENANT = "tenant"
    USER = "user"  # per identity: the business quota
    ENDPOINT = "endpoint"  # per identity, method and resource: expensive endpoints
    # Not a rate: requests in flight at once (a plan's per caller, a limit's per resource).
    CONCURRENT = "concurrent"
    # Not the caller's: the whole fleet's requests in flight (``QUOTA_CAPACITY``), a
    # request's class deciding how much of it it may use. Its denial is a shed (503).
    CAPACITY = "capacity"
    # Not a rate: a prepaid balance per caller and resource (a plan's ``"credits"``
    # resource, ``core/credits.py``). Its denial is 402; time never refills it.
    CREDITS = "credits"


RATE_TIERS = (Tier.GLOBAL, Tier.TENANT, Tier.USER, Tier.ENDPOINT)
"""The tiers that hold rates: what plan limits, overrides, their SQL rows, the CLI and
the dashboard name (a plan's concurrency limit is a number, not a tier's rate)."""
