"""The near-limit rule: when a bucket is "about to hit the limit" (``QUOTA_NEAR_LIMIT``).

A bucket of ``limit`` is near it once ``ceil(share * limit)`` units are used. A
request *crosses* the line when the units it was charged take the bucket from
below the line to on or above it. Both are read from the numbers the atomic
storage call answers (what is left after the charge, and the charge), so the
one request that crosses is the only one told, whichever worker or server it
hit; a bucket that refills below the line and climbs back crosses again.
"""

from __future__ import annotations

import math
from fractions import Fraction

__all__ = ["is_near", "room"]


def room(limit: int, share: float) -> int:
    """What is left of a bucket of ``limit`` when it reaches the line: ``remaining <= room``
    means near. At least one unit is used before a bucket is near."""
    # repr() is the float's shortest text: 0.8 is 4/5 exactly, so 0.8 * 10 is 8, not 8.000...1.
    used = max(1, math.ceil(Fraction(repr(share)) * limit))
    return limit - used


def is_near(limit: int, remaining: int, share: float) -> bool:
    """True when a bucket of ``limit`` with ``remaining`` left is on or above the line."""
    return limit > 0 and remaining <= room(limit, share)
