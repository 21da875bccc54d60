"""Rate strings: ``"100/minute"``, ``"100 per minute"``, ``"10/second; burst=100"``,
``"1000/month"`` (a calendar window, see ``calendar.py``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .calendar import MONTH, UNITS, YEAR
from .clock import US

__all__ = [
    "CREDITS",
    "CREDITS_TEXT",
    "MAX_LIMIT",
    "MAX_RATES",
    "MAX_WINDOW",
    "Credits",
    "Rate",
    "Rates",
    "parse_rate",
    "parse_rates",
]

# Redis decides in Lua, whose numbers are doubles: integers are exact below 2^53.
# Microsecond times near now (~2^50.6) plus two windows, or plus a bucket's refill
# time, stay below 2^53 until the year 2255 with these caps; counts stay far below
# it. (The sliding window counter's products, e.g. prev x elapsed, can pass 2^53
# even so: its Lua twin multiplies them exactly, see ``muldiv``.)
MAX_WINDOW = 366 * 86400
"""The longest window, in seconds (366 days); also the longest refill of a full bucket."""
MAX_LIMIT = 10**12
"""The largest limit and the largest burst."""
_CAPS = f"windows and refills up to 366 days ({MAX_WINDOW} s), limits and bursts up to {MAX_LIMIT}"

# A calendar window's nominal length, in seconds: its longest (31 days, 366 days). It is
# what ``RateLimit-Policy``'s ``w`` says and what the caps check; the counting itself
# follows the calendar (``calendar.Calendar``).
CALENDAR_WINDOWS = {MONTH: 31 * 86400, YEAR: 366 * 86400}

_UNITS = {
    "s": 1, "sec": 1, "second": 1,
    "m": 60, "min": 60, "minute": 60,
    "h": 3600, "hr": 3600, "hour": 3600,
    "d": 86400, "day": 86400,
    "month": CALENDAR_WINDOWS[MONTH], "year": CALENDAR_WINDOWS[YEAR],
}  # fmt: skip
_UNIT_NAMES = {1: "second", 60: "minute", 3600: "hour", 86400: "day"}
# A calendar unit's seconds, which no other unit has, name it ("31 days" is not "month").
_CALENDAR_UNIT = {seconds: unit for unit, seconds in CALENDAR_WINDOWS.items()}

_RATE_RE = re.compile(
    r"""^\s*(?P<limit>\d{1,18})\s*(?:/|\s+per\s+)\s*
        (?:(?P<mult>\d{1,18})\s*)?(?P<unit>[a-z]{1,10})\s*
        (?:;\s*burst\s*=\s*(?P<burst>\d{1,18})\s*)?$""",
    re.IGNORECASE | re.VERBOSE | re.ASCII,
)

ACCEPTED = (
    "'N/second', 'N per minute', 'N/hour', 'N/day', 'N/5 minutes', "
    "optionally followed by '; burst=B', or 'N/month', 'N/year' (N and B positive integers)"
)
MAX_RATES = 4  # rates on one limit, e.g. a burst guard, a minute, an hour and a day
_MAX_TEXT = 100  # characters of a limit's text, all rates (the SQL column's width)


@dataclass(frozen=True, slots=True)
class Rate:
    """``limit`` units per ``window`` seconds; a token bucket holds ``burst`` (or ``limit``)."""

    limit: int
    window: int
    burst: int | None = None
    calendar: str | None = None
    """``"month"`` or ``"year"``: a fixed window on the calendar (``window`` is nominal)."""
    # Derived, kept as fields: the algorithms read them on every decision, and a
    # slot is read in C where a property runs Python code.
    window_us: int = field(init=False, repr=False, compare=False)
    """The window in microseconds, the unit the algorithms count in."""
    capacity: int = field(init=False, repr=False, compare=False)
    """Token bucket size; equals ``limit`` unless a burst is given."""
    interval_us: int = field(init=False, repr=False, compare=False)
    """One unit's worth of time (``window_us // limit``): a token bucket's refill step."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "window_us", self.window * US)
        object.__setattr__(self, "capacity", self.limit if self.burst is None else self.burst)
        if self.limit <= 0 or self.window <= 0 or (self.burst is not None and self.burst <= 0):
            # Numbers, not str(self): a zero window prints in whatever unit divides it
            # ("1/0 days" for "1/0 seconds").
            burst = "" if self.burst is None else f", burst {self.burst}"
            raise ValueError(
                f"a rate needs a positive limit, window and burst, not limit {self.limit}, "
                f"window {self.window} s{burst}"
            )
        object.__setattr__(self, "interval_us", self.window_us // self.limit)
        if self.calendar is not None:
            if CALENDAR_WINDOWS.get(self.calendar) != self.window:
                raise ValueError(f"a calendar rate is per {' or per '.join(UNITS)}")
            if self.burst is not None:
                # A burst shapes a token bucket; a calendar window is always a fixed window.
                raise ValueError(
                    f"a calendar rate ({self.limit}/{self.calendar}) takes no burst: it is "
                    "counted as a fixed window on the calendar"
                )
        if self.window > MAX_WINDOW:
            raise ValueError(f"rate {self!s} has a window longer than 366 days; allowed: {_CAPS}")
        if self.limit > MAX_LIMIT or (self.burst is not None and self.burst > MAX_LIMIT):
            raise ValueError(f"rate {self!s} counts beyond {MAX_LIMIT}; allowed: {_CAPS}")
        if self.interval_us < 1:
            # Algorithms work in whole microseconds; one unit per microsecond is the ceiling.
            raise ValueError(f"rate {self!s} is faster than one request per microsecond")
        if self.capacity * self.interval_us > MAX_WINDOW * US:
            raise ValueError(
                f"rate {self!s} would take longer than 366 days to refill a full bucket "
                f"(lower the burst or raise the rate); allowed: {_CAPS}"
            )

    @property
    def policy_window(self) -> int:
        """Seconds for a full bucket to refill from empty (the IETF ``w`` parameter)."""
        if self.burst is None:
            return self.window
        return max(1, -(-self.burst * self.window // self.limit))

    def _period(self) -> str:
        """``minute``, ``5 minutes``, ``278 hours``: the largest unit that divides the window."""
        if self.calendar is not None:
            return self.calendar
        for seconds in (86400, 3600, 60, 1):
            if self.window % seconds == 0:
                count, unit = self.window // seconds, _UNIT_NAMES[seconds]
                return unit if count == 1 else f"{count} {unit}s"
        raise AssertionError("unreachable: every window is whole seconds")

    def per(self) -> str:
        """Human wording, e.g. ``"30 per minute"``."""
        return f"{self.limit} per {self._period()}"

    def __str__(self) -> str:
        text = f"{self.limit}/{self._period()}"
        return text if self.burst is None else f"{text}; burst={self.burst}"


def _unit_seconds(word: str) -> int | None:
    word = word.lower()
    if word not in _UNITS and len(word) > 2 and word.endswith("s"):
        word = word[:-1]  # plural; "ms" stays unknown rather than meaning minutes
    return _UNITS.get(word)


def parse_rate(text: str | Rate) -> Rate:
    """Parse a rate string; raise ``ValueError`` naming the text and the accepted forms."""
    if isinstance(text, Rate):
        return text
    if not isinstance(text, str):
        raise ValueError(f"rate must be a string such as '100/minute', not {type(text).__name__}")
    match = _RATE_RE.match(text) if len(text) <= 100 else None
    unit = _unit_seconds(match.group("unit")) if match else None
    if match is None or unit is None:
        raise ValueError(f"malformed rate {text[:100]!r}: expected {ACCEPTED}{_comma_hint(text)}")
    mult = int(match.group("mult") or 1)
    burst = match.group("burst")
    calendar = _CALENDAR_UNIT.get(unit)
    if calendar is not None and match.group("mult"):
        raise ValueError(
            f"invalid rate {text!r}: a calendar window is one {calendar}, not several; "
            f"expected {ACCEPTED}"
        )
    try:
        return Rate(int(match.group("limit")), mult * unit, int(burst) if burst else None, calendar)
    except ValueError as exc:
        raise ValueError(f"invalid rate {text!r}: {exc}; expected {ACCEPTED}") from None


def _comma_hint(text: str) -> str:
    """For "10/second; 100/day", rates joined by ';' (which only introduces a burst):
    the comma form that ``parse_rates`` takes, when every part is a rate."""
    parts = [part.strip() for part in text[:_MAX_TEXT].split(";")]
    if len(parts) < 2 or not all(_RATE_RE.match(part) for part in parts):
        return ""
    return f"; to give several rates, separate them with commas: {', '.join(parts)!r}"


class Rates(tuple[Rate, ...]):
    """One limit's rates, e.g. ``"10/second, 10000/day"``: each is its own check.

    A tuple, so it is hashable and compares by value; ``str()`` is the
    canonical comma-joined text that plans and the SQL table store.
    """

    __slots__ = ()

    def __str__(self) -> str:
        return ", ".join(str(rate) for rate in self)

    def per(self) -> str:
        """Human wording, e.g. ``"10 per second, 10000 per day"``."""
        return ", ".join(rate.per() for rate in self)

    @property
    def per_second(self) -> float:
        """The long-run allowance: the strictest rate's units per second."""
        return min(rate.limit / rate.window for rate in self)


class Credits(Rates):
    """A resource's "rate" that is no rate: a prepaid balance (``"credits"``), spent by
    what the caller's grants hold and never refilled by time (``core/credits.py``).

    A ``Rates`` of one placeholder rate, so that every place a resource's rates travel
    (plans, SQL rows, the CLI, the dashboard, exports) carries it unchanged; the policy
    turns it into a balance check instead of rate checks. ``CREDITS`` is the one value.
    """

    __slots__ = ()

    def __str__(self) -> str:
        return CREDITS_TEXT

    def per(self) -> str:
        return "prepaid credits"

    @property
    def per_second(self) -> float:
        return 0.0  # never "more" than a rate: an upgrade hint never offers credits


CREDITS_TEXT = "credits"
CREDITS = Credits((Rate(1, 1),))
"""A credits resource (``{"resources": {"ai_tokens": "credits"}}``): see ``Credits``."""


def parse_rates(text: str | Rate | Rates) -> Rates:
    """Parse one or more comma-separated rates into ``Rates``; ``"credits"`` is
    ``CREDITS``, a prepaid balance (a resource's only: ``Plan`` refuses it elsewhere).

    Raises ``ValueError`` naming the text: for a malformed rate, more than
    ``MAX_RATES`` rates, or two rates with the same window (the stricter one
    would make the other pointless, and their policy names would clash).
    """
    if isinstance(text, Rates):
        return text
    if isinstance(text, Rate):
        return Rates((text,))
    if not isinstance(text, str):
        raise ValueError(f"rate must be a string such as '100/minute', not {type(text).__name__}")
    if text.strip().lower() == CREDITS_TEXT:
        return CREDITS
    if len(text) > _MAX_TEXT:
        raise ValueError(f"rates {text[:_MAX_TEXT]!r}... are longer than {_MAX_TEXT} characters")
    parts = text.split(",")
    if len(parts) > MAX_RATES:
        raise ValueError(f"rates {text!r}: at most {MAX_RATES} rates on one limit")
    rates = Rates(parse_rate(part) for part in parts)
    windows = [rate.window for rate in rates]
    if len(set(windows)) != len(windows):
        raise ValueError(f"rates {text!r}: two rates share a window; keep the stricter one")
    if len(str(rates)) > _MAX_TEXT:
        raise ValueError(f"rates {text!r} are longer than {_MAX_TEXT} characters")
    return rates
