"""The documented old home of ``QuotaAdmin`` and ``AdminError``, kept so code written
against it keeps working. Their home is ``flask_quota.sql.admin``; import from there."""

from __future__ import annotations

from .sql.admin import (
    AdminError,
    AuditInfo,
    ChangeConflict,
    ClientInfo,
    LimitInfo,
    OverrideInfo,
    PlanInfo,
    PlansReadOnly,
    QuotaAdmin,
    StaleEdit,
    parse_duration,
)

__all__ = [
    "AdminError",
    "AuditInfo",
    "ChangeConflict",
    "ClientInfo",
    "LimitInfo",
    "OverrideInfo",
    "PlanInfo",
    "PlansReadOnly",
    "QuotaAdmin",
    "StaleEdit",
    "parse_duration",
]
