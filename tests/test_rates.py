"""Rate strings: the forms users type and the errors they get."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flask_quota.core.rates import Rate, parse_rate


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("100/minute", Rate(100, 60)),
        ("100 per minute", Rate(100, 60)),
        ("50/second", Rate(50, 1)),
        ("1000/hour", Rate(1000, 3600)),
        ("10000/day", Rate(10000, 86400)),
        ("10/second; burst=100", Rate(10, 1, 100)),
        ("10 / 5 minutes", Rate(10, 300)),
        ("  7 PER Hours ", Rate(7, 3600)),
        ("3/2 days;burst=9", Rate(3, 172800, 9)),
    ],
)
def test_accepted_forms(text: str, expected: Rate) -> None:
    """Every documented form parses to limit, window and burst."""
    assert parse_rate(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "100", "100/", "/minute", "100/ms", "100/fortnight", "-5/minute", "0/minute",
     "1.5/second", "10/second; burst=0", "10/second; burst=", "10/second burst=5",
     "2000000/second", "100/minute\r\nX: y", "\uff11\uff10\uff10/minute", "9" * 200 + "/second"],
)  # fmt: skip
def test_malformed_rates_name_the_text_and_the_forms(text: str) -> None:
    """A malformed rate raises ValueError quoting the text and the accepted forms."""
    with pytest.raises(ValueError) as info:
        parse_rate(text)
    message = str(info.value)
    assert repr(text[:100])[:20] in message
    assert "N/second" in message


def test_non_string_rate_is_a_value_error() -> None:
    """Passing a number instead of a string is reported, not crashed on."""
    with pytest.raises(ValueError, match="must be a string"):
        parse_rate(100)  # type: ignore[arg-type]


def test_capacity_and_policy_window() -> None:
    """Burst sets the bucket size and the IETF window is the time to refill it."""
    assert parse_rate("100/minute").capacity == 100
    assert parse_rate("100/minute").policy_window == 60
    rate = parse_rate("10/second; burst=100")
    assert (rate.capacity, rate.policy_window) == (100, 10)


@given(st.text(max_size=40))
def test_parse_rate_raises_only_value_error(text: str) -> None:
    """Any string either parses or raises ValueError; never anything else."""
    try:
        rate = parse_rate(text)
    except ValueError:
        return
    assert rate.limit > 0 and rate.window > 0
    assert parse_rate(str(rate)) == rate


@pytest.mark.parametrize("text", ["1/0 seconds", "1/0 minutes", "0/second", "10/second; burst=0"])
def test_a_zero_rate_is_refused_naming_the_text_given(text: str) -> None:
    """A zero limit, window or burst is refused quoting the text as written; the message
    never re-prints the rate in another unit ("1/0 seconds" is not "1/0 days")."""
    with pytest.raises(ValueError) as info:
        parse_rate(text)
    message = str(info.value)
    assert repr(text) in message, message
    assert "days" not in message, message


def test_semicolon_between_rates_suggests_the_comma_form() -> None:
    """Two rates joined by ';' ("10/second; 100/day"), where only '; burst=B' belongs:
    the error names the text and suggests the comma form that parse_rates accepts."""
    from flask_quota.core.rates import parse_rates

    with pytest.raises(ValueError) as info:
        parse_rates("10/second; 100/day")
    message = str(info.value)
    assert "'10/second; 100/day'" in message, message
    assert "'10/second, 100/day'" in message, message
    assert str(parse_rates("10/second, 100/day")) == "10/second, 100/day"
