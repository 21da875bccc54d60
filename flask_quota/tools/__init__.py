"""The library as the operator's tools see it: the one door the dashboard uses.

Everything the bundled dashboard needs beyond the public face (``flask_quota``)
is named here, so it depends on these names and not on how the modules behind
them are laid out.
"""

from __future__ import annotations

from ..admin import (
    PLANS_READ_ONLY,
    AdminError,
    ChangeConflict,
    PlanInfo,
    PlansReadOnly,
    QuotaAdmin,
    parse_duration,
)
from ..blocks import block, list_blocks, unblock
from ..clock import US, seconds_until, wall_clock_us
from ..identity import client_ip
from ..inspection import BucketState, Caller, TierCheck, caller_checks, is_tag, peek, plan_of, reset
from ..keys import KeyBuilder
from ..models import Client
from ..policy import gate_check
from ..sql_store import TablesMissing
from ..state import QuotaState, exempt, get_state
from ..storage import Check, MemoryStorage, Storage, StorageError
from ..usage import HOUR, SHADOW_DENIED, Mark, MinuteUsage

__all__ = [
    "HOUR",
    "PLANS_READ_ONLY",
    "SHADOW_DENIED",
    "US",
    "AdminError",
    "BucketState",
    "Caller",
    "ChangeConflict",
    "Check",
    "Client",
    "KeyBuilder",
    "Mark",
    "MemoryStorage",
    "MinuteUsage",
    "PlanInfo",
    "PlansReadOnly",
    "QuotaAdmin",
    "QuotaState",
    "Storage",
    "StorageError",
    "TablesMissing",
    "TierCheck",
    "block",
    "caller_checks",
    "client_ip",
    "exempt",
    "gate_check",
    "get_state",
    "is_tag",
    "list_blocks",
    "parse_duration",
    "peek",
    "plan_of",
    "reset",
    "seconds_until",
    "unblock",
    "wall_clock_us",
]
