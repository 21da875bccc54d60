"""The three tiers every request is checked against."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["Tier"]


class Tier(StrEnum):
    """The tiers a request is checked against, in this order."""

    GLOBAL = "global"  # per client IP: the first wall against floods
    USER = "user"  # per identity: the business quota
    ENDPOINT = "endpoint"  # per identity, method and resource: expensive endpoints
