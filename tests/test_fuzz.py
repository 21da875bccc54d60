"""Fuzzing: rate strings, configuration, storage URLs, headers and identities.

Nothing may raise but the documented errors: ``ValueError`` (naming the bad text or
key) at configuration time, and no request may end in a 500.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import redis
from flask import Flask, request
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from werkzeug.test import EnvironBuilder, run_wsgi_app

from flask_quota import Identity, Quota
from flask_quota.core.algorithms import Algorithm
from flask_quota.core.keys import KeyBuilder
from flask_quota.core.rates import Rate, parse_rate
from flask_quota.settings import DEFAULTS, Settings
from flask_quota.storage import Check, MemoryStorage, storage_from_url
from flask_quota.storage.redis import RedisStorage
from flask_quota.testing import FrozenClock

UNITS = ["s", "sec", "second", "seconds", "m", "min", "minute", "minutes", "h", "hour", "d", "day"]


# -- rates ---------------------------------------------------------------------------


@given(st.text(max_size=60))
def test_any_text_parses_or_raises_value_error(text: str) -> None:
    """Arbitrary text is a Rate or a ValueError that quotes the accepted forms."""
    try:
        rate = parse_rate(text)
    except ValueError as exc:
        assert "expected" in str(exc)
    else:
        assert rate.limit > 0 and rate.window > 0


@given(
    limit=st.integers(min_value=0, max_value=10**13),
    mult=st.one_of(st.none(), st.integers(min_value=0, max_value=10**7)),
    unit=st.sampled_from([*UNITS, "fortnight", "ms", ""]),
    burst=st.one_of(st.none(), st.integers(min_value=0, max_value=10**13)),
    per=st.sampled_from(["/", " per ", " / ", "per"]),
    case=st.booleans(),
)
def test_rate_shaped_text_round_trips(
    limit: int, mult: int | None, unit: str, burst: int | None, per: str, case: bool
) -> None:
    """Near-valid rates either parse to a Rate that prints and re-parses to itself, or
    raise ValueError; never anything else."""
    text = f"{limit}{per}{'' if mult is None else f'{mult} '}{unit}"
    if burst is not None:
        text += f"; burst={burst}"
    text = text.upper() if case else text
    try:
        rate = parse_rate(text)
    except ValueError:
        return
    assert rate.window_us // rate.limit >= 1
    assert parse_rate(str(rate)) == rate


def test_every_accepted_rate_prints_a_rate_that_parses() -> None:
    """``str(rate)`` of any accepted rate is accepted again (found by the fuzzer)."""
    rate = parse_rate("1/278 hours")
    assert parse_rate(str(rate)) == rate


# -- configuration -------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([10**400, -(10**400)]),  # beyond any float
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=30),
    st.sampled_from(["true", "false", "0", "1", "open", "closed", "local", "both", "redis://x"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
PLAN_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "global": st.one_of(st.sampled_from(["50/second", "1/day", "0/minute"]), VALUES),
        "user": st.one_of(st.sampled_from(["100/minute", "5 per hour; burst=9"]), VALUES),
        "resources": st.one_of(st.dictionaries(st.text(max_size=5), st.text(max_size=12)), VALUES),
        "description": VALUES,
        "upgrade": VALUES,
    },
)
PLANS = st.one_of(VALUES, st.dictionaries(st.sampled_from(["free", "pro", ""]), PLAN_FIELDS))
CONFIG_KEYS = [k for k in DEFAULTS if k != "QUOTA_DATABASE_URL"]  # that one imports drivers


@settings(max_examples=300, deadline=None)
@given(
    config=st.dictionaries(st.sampled_from(CONFIG_KEYS), VALUES, max_size=6),
    plans=st.one_of(st.none(), PLANS, PLANS.map(str)),
)
def test_settings_accept_or_name_the_bad_key(config: dict[str, Any], plans: Any) -> None:
    """Any mix of values for the QUOTA_* keys builds Settings or raises a ValueError that
    names a QUOTA_ key."""
    if plans is not None:
        config["QUOTA_PLANS"] = plans
    try:
        parsed = Settings.from_config(config)
    except ValueError as exc:
        assert "QUOTA_" in str(exc), exc
    else:
        assert parsed.storage_timeout > 0 and math.isfinite(parsed.storage_timeout)
        assert parsed.default_plan in parsed.plans


@given(
    st.one_of(
        st.text(max_size=40),
        st.builds(
            lambda scheme, rest: f"{scheme}://{rest}",
            st.sampled_from(["redis+cluster", "redis+sentinel", "REDIS+CLUSTER", "memory", "x"]),
            st.text(alphabet="abc123:.,/@[]?=%", max_size=30),
        ),
    )
)
def test_storage_urls_build_or_raise_value_error(url: str) -> None:
    """A QUOTA_STORAGE_URL builds a backend without connecting, or raises ValueError."""
    assume(not url.lower().startswith(("redis://", "rediss://", "unix://")))  # redis-py's own
    try:
        storage = storage_from_url(url, timeout=0.05)
    except ValueError as exc:
        assert "QUOTA_STORAGE_URL" in str(exc)
    else:
        storage.close()


# -- requests ------------------------------------------------------------------------

KNOWN_KEY = "known_key_0123456789"
HEADER_TEXT = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0xFF), max_size=80)


def fuzz_app(reject_unknown_keys: bool) -> Flask:
    app = Flask(__name__)
    app.config.update(
        TESTING=True,
        QUOTA_PLANS={
            "free": {"global": "1000/second", "user": "3/hour", "resources": {"ai": "2/hour"}},
            "pro": {"user": "10/hour"},
        },
        QUOTA_REJECT_UNKNOWN_KEYS=reject_unknown_keys,
        QUOTA_DATABASE_URL="sqlite://",
    )
    quota = Quota(app, storage=MemoryStorage(FrozenClock()))

    @quota.identity_loader
    def from_header() -> Identity | None:
        client = request.headers.get("X-Client")
        return Identity(client, request.headers.get("X-Plan")) if client else None

    @quota.api_key_loader
    def lookup(key: str) -> Identity | None:
        return Identity("known", "pro") if key == KNOWN_KEY else None

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    @app.post("/ai")
    @quota.limit(resource="ai", cost=lambda: int(request.args.get("n", "1") or 1) % 5)
    def ai() -> str:
        return "ok"

    return app


APPS = {flag: fuzz_app(flag) for flag in (False, True)}


@settings(max_examples=300, deadline=None)
@given(
    headers=st.dictionaries(
        st.sampled_from(
            ["X-API-Key", "X-Client", "X-Plan", "X-Forwarded-For", "Forwarded", "Host"]
        ),
        HEADER_TEXT,
    ),
    remote=st.one_of(HEADER_TEXT, st.ip_addresses().map(str)),
    path=st.sampled_from(["/ping", "/ai", "/ai?n=3", "/missing", "/ping/"]),
    reject=st.booleans(),
)
def test_hostile_headers_never_cause_a_500(
    headers: dict[str, str], remote: str, path: str, reject: bool
) -> None:
    """Raw WSGI requests with arbitrary header bytes and client addresses answer 2xx, 3xx,
    401, 404, 405 or 429, never an error from the limiter."""
    environ = EnvironBuilder(
        path=path.split("?")[0],
        query_string=path.partition("?")[2],
        method="POST" if path.startswith("/ai") else "GET",
    ).get_environ()
    environ["REMOTE_ADDR"] = remote
    for name, value in headers.items():
        environ["HTTP_" + name.upper().replace("-", "_")] = value  # raw latin-1, unvalidated
    _, status, _ = run_wsgi_app(APPS[reject], environ)
    code = int(status.split()[0])
    assert code in {200, 301, 308, 400, 401, 404, 405, 429}, status
    if code == 401:
        assert reject


def test_an_identity_cannot_pose_as_another_identitys_digest() -> None:
    """A caller named like the digest of a long identity gets keys of its own."""
    long_identity = "customer-" + "x" * 200
    digest_tag = KeyBuilder.identity_tag(long_identity)
    assert KeyBuilder.identity_tag(digest_tag.removeprefix("id=")) != digest_tag


def test_an_identity_with_a_lone_surrogate_makes_a_key() -> None:
    """Identities from JSON may hold lone surrogates; they still make a key."""
    assert KeyBuilder.identity_tag("user-\ud800").startswith("id=user-")


@pytest.mark.redis
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(identity=st.text(min_size=1, max_size=300), ip=st.ip_addresses().map(str))
def test_any_identity_makes_a_working_redis_key(
    redis_client: redis.Redis, identity: str, ip: str
) -> None:
    """Whatever an identity contains (unicode, braces, colons, 300 characters), its keys
    are accepted by the real Redis script and count exactly."""
    keys = KeyBuilder("quota")
    tag = keys.identity_tag(identity)
    checks = [
        Check(keys.global_key(keys.ip_tag(ip), Algorithm.FIXED_WINDOW), Algorithm.FIXED_WINDOW,
              Rate(100, 60), 1),
        Check(keys.user_key(tag, Algorithm.FIXED_WINDOW), Algorithm.FIXED_WINDOW, Rate(2, 60), 1),
    ]  # fmt: skip
    storage = RedisStorage(redis_client, clock=FrozenClock(1_700_000_040.0))
    redis_client.delete(*(c.key for c in checks))
    assert [storage.decide(checks).allowed for _ in range(3)] == [True, True, False]
    assert all(len(c.key.encode()) < 400 for c in checks)
