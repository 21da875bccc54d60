"""Calendar windows: months from a billing day and years, in one IANA time zone.

A ``N/month`` or ``N/year`` rate is a fixed window whose edges are local midnights
in ``QUOTA_TIMEZONE``, so its length varies (28 to 31 days, 365 or 366, an hour
more or less across a DST change). This module turns an instant into that
window's edges; it never reads a clock, the storage hands it its own.
"""

from __future__ import annotations

import calendar as _calendar
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["MONTH", "UNITS", "YEAR", "Bounds", "Calendar"]

MONTH, YEAR = "month", "year"
UNITS = (MONTH, YEAR)

Bounds = tuple[int, int, int, int]
"""Window edges in microseconds: the previous window's start, this window's start,
its end, the next window's end."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_US = timedelta(microseconds=1)
# The years a window may touch: Python's datetime stops at 1..9999, and a window
# needs its neighbours.
_FIRST_YEAR, _LAST_YEAR = 2, 9997


class Calendar:
    """Where calendar windows start: ``zone`` (an IANA name) and ``billing_day``.

    A month starts at 00:00 local on ``billing_day`` (clamped to the month's last
    day, so 31 means "the last day" in April); a year starts at 00:00 on January 1,
    whatever the billing day. Where a DST change skips midnight, the window starts
    at the first instant of that local day.

    Each unit remembers the last window it computed, so a decision in the same
    window (nearly all of them) costs two comparisons.
    """

    __slots__ = ("_days", "_last", "billing_day", "zone", "zone_name")

    def __init__(self, zone: str = "UTC", billing_day: int = 1) -> None:
        if isinstance(billing_day, bool) or not isinstance(billing_day, int):
            raise ValueError(f"billing day must be an int from 1 to 31, not {billing_day!r}")
        if not 1 <= billing_day <= 31:
            raise ValueError(f"billing day must be from 1 to 31, not {billing_day}")
        if not isinstance(zone, str) or not zone:
            raise ValueError(f"time zone must be an IANA name such as 'UTC', not {zone!r}")
        try:
            self.zone = ZoneInfo(zone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {zone!r}: use an IANA name such as 'UTC' or "
                "'Europe/Berlin' (install the tzdata package where the system has none)"
            ) from None
        self.zone_name = zone
        self.billing_day = billing_day
        self._last: dict[str, Bounds] = {}
        self._days: dict[int, Calendar] = {}

    def __repr__(self) -> str:
        return f"Calendar({self.zone_name!r}, billing_day={self.billing_day})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Calendar):
            return NotImplemented
        return (self.zone_name, self.billing_day) == (other.zone_name, other.billing_day)

    def __hash__(self) -> int:
        return hash((self.zone_name, self.billing_day))

    def on_day(self, billing_day: int) -> Calendar:
        """This calendar with another billing day (a client's own), made once per day."""
        if billing_day == self.billing_day:
            return self
        found = self._days.get(billing_day)
        if found is None:
            found = self._days[billing_day] = Calendar(self.zone_name, billing_day)
        return found

    def span(self, unit: str, now_us: int) -> tuple[int, int]:
        """(start, end) in microseconds of the ``unit`` window that ``now_us`` falls in."""
        bounds = self.bounds(unit, now_us)
        return bounds[1], bounds[2]

    def bounds(self, unit: str, now_us: int) -> Bounds:
        """The edges around the window ``now_us`` falls in: previous start, start, end,
        next end. Redis is handed these and picks the window its own clock falls in."""
        last = self._last.get(unit)
        if last is not None and last[1] <= now_us < last[2]:
            return last
        bounds = self._compute(unit, now_us)
        self._last[unit] = bounds  # one assignment: safe under threads
        return bounds

    def _compute(self, unit: str, now_us: int) -> Bounds:
        local = (_EPOCH + now_us * _ONE_US).astimezone(self.zone)
        if unit == MONTH:
            index = local.year * 12 + local.month - 1  # months since year 0
        elif unit == YEAR:
            index = local.year
        else:
            raise ValueError(f"unknown calendar unit {unit!r}; expected one of {UNITS}")
        if self._start(unit, index) > now_us:
            index -= 1  # before this month's billing day: the window began last month
        return (
            self._start(unit, index - 1),
            self._start(unit, index),
            self._start(unit, index + 1),
            self._start(unit, index + 2),
        )

    def _start(self, unit: str, index: int) -> int:
        """Microseconds of the local midnight that starts window ``index``."""
        if unit == MONTH:
            year, month = divmod(index, 12)
            month += 1
            day = min(self.billing_day, _calendar.monthrange(year, month)[1])
        else:
            year, month, day = index, 1, 1
        if not _FIRST_YEAR <= year <= _LAST_YEAR:
            raise ValueError(f"calendar windows are computed for years {_FIRST_YEAR}-{_LAST_YEAR}")
        return self._midnight(date(year, month, day))

    def _midnight(self, day: date) -> int:
        """The first instant of local ``day``: 00:00, or the end of a DST gap over it.

        ``fold=0`` reads a non-existent local time with the offset before the gap, which
        lands on the instant the gap ends; if that instant is already a later day (a zone
        that skipped the whole day, Samoa in 2011), the day's first instant is that one.
        """
        local = datetime(day.year, day.month, day.day, tzinfo=self.zone)
        return (local - _EPOCH) // _ONE_US
