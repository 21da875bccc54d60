"""A sliding log's size is bounded, so one caller cannot stall Redis for everyone.

The log keeps one entry per unit and Redis reads all of them on every decision: a
1,000,000/hour log with ``cost=1000`` grew to 410,000 entries in 41 requests, and each
decision then blocked Redis for tens of milliseconds. A log's limit is at most
``MAX_LOG_LIMIT``; a larger one is refused where it is configured, with a message naming
the algorithms that fit, and a combination that reaches the policy anyway (a decorator's
literal rate on ``QUOTA_ALGORITHM``, a row written into SQL) is decided on a sliding
counter instead, never on an oversized log.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import redis
from flask import Flask
from hypothesis import given
from hypothesis import strategies as st

from flask_quota import Quota
from flask_quota.core.adjust import charge_log
from flask_quota.core.algorithms import (
    MAX_LOG_LIMIT,
    Algorithm,
    bound_debt,
    charged_units,
    sliding_window_log,
)
from flask_quota.core.keys import KeyBuilder
from flask_quota.core.plans import Plan, catalog_from_config
from flask_quota.core.policy import LimitSpec, Policy
from flask_quota.core.rates import Rate, parse_rates
from flask_quota.settings import Settings
from flask_quota.storage import MemoryStorage
from flask_quota.storage.redis import RedisStorage

BIG = "1000000/hour"
LOG = Algorithm.SLIDING_WINDOW_LOG
S = 1_000_000
FITTING = ("sliding_window_counter", "token_bucket")


def refusal(config: dict[str, object]) -> str:
    with pytest.raises(ValueError) as info:
        Settings.from_config(config)
    return str(info.value)


def test_a_plan_limit_with_its_own_log_algorithm_is_refused() -> None:
    """QUOTA_PLANS giving a 1,000,000/hour limit the sliding_window_log algorithm fails at
    configuration, naming the limit, the bound and an algorithm that fits."""
    message = refusal(
        {"QUOTA_PLANS": {"free": {"user": {"rate": BIG, "algorithm": "sliding_window_log"}}}}
    )
    assert "QUOTA_PLANS['free']['user']" in message and BIG in message, message
    assert str(MAX_LOG_LIMIT) in message and all(a in message for a in FITTING), message


def test_quota_algorithm_log_with_a_large_plan_rate_is_refused() -> None:
    """QUOTA_ALGORITHM=sliding_window_log with a plan resource of 1,000,000/hour fails,
    naming QUOTA_ALGORITHM and how to give that one limit another algorithm."""
    message = refusal(
        {
            "QUOTA_ALGORITHM": "sliding_window_log",
            "QUOTA_PLANS": {"free": {"user": "10/minute", "resources": {"tokens": BIG}}},
        }
    )
    assert "QUOTA_PLANS['free']['resources']['tokens']" in message, message
    assert "QUOTA_ALGORITHM" in message and "'algorithm': 'sliding_window_counter'" in message


def test_the_bound_itself_is_accepted_and_other_algorithms_take_any_limit() -> None:
    """A log of exactly MAX_LOG_LIMIT per window is fine, and so is 1,000,000/hour on
    every other algorithm."""
    plans = {"free": {"user": f"{MAX_LOG_LIMIT}/hour", "resources": {"r": "5/minute"}}}
    Settings.from_config({"QUOTA_ALGORITHM": "sliding_window_log", "QUOTA_PLANS": plans})
    for algorithm in ("token_bucket", "fixed_window", "sliding_window_counter"):
        Settings.from_config({"QUOTA_ALGORITHM": algorithm, "QUOTA_PLANS": {"free": {"user": BIG}}})


def test_an_import_cannot_bring_a_large_log() -> None:
    """The import path's parser (``catalog_from_config``) refuses the same limit, also
    when the log comes from the QUOTA_ALGORITHM it is given."""
    with pytest.raises(ValueError, match="sliding_window_counter"):
        catalog_from_config(
            {"free": {"user": {"rate": BIG, "algorithm": "sliding_window_log"}}},
            upgrade_url="/pricing",
        )
    with pytest.raises(ValueError, match="QUOTA_ALGORITHM"):
        catalog_from_config(
            {"free": {"user": BIG}},
            upgrade_url="/pricing",
            algorithm=Algorithm.SLIDING_WINDOW_LOG,
        )


def test_the_cli_import_of_a_large_log_exits_non_zero(tmp_path: Path) -> None:
    """``flask quota plans import`` of a file with a 1,000,000/hour log fails and
    changes nothing."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config["QUOTA_DATABASE_URL"] = f"sqlite:///{tmp_path}/quota.sqlite3"
    Quota(app)
    path = tmp_path / "plans.json"
    plans = {"free": {"user": {"rate": BIG, "algorithm": "sliding_window_log"}}}
    path.write_text(json.dumps(plans))
    result = app.test_cli_runner().invoke(
        args=["quota", "plans", "import", str(path), "--actor", "alice"]
    )
    assert result.exit_code != 0, result.output
    assert "sliding_window_counter" in result.output, result.output
    exported = app.test_cli_runner().invoke(args=["quota", "plans", "export"])
    assert BIG not in exported.output


def test_the_policy_never_builds_an_oversized_log(caplog: pytest.LogCaptureFixture) -> None:
    """A decorator's literal 1,000,000/hour on QUOTA_ALGORITHM=sliding_window_log (the
    decorator does not know the algorithm) is checked on a sliding counter, and the
    error log says so once; a fitting log stays a log."""
    policy = Policy(KeyBuilder("quota"), Algorithm.SLIDING_WINDOW_LOG)
    plan = Plan("free")

    def algorithms(rate: str) -> list[Algorithm | object]:
        spec = LimitSpec(parse_rates(rate), "tokens", 1)
        checks = policy.checks(
            plan, ip_tag="ip=1", identity_tag="id=1", method="GET", spec=spec,
            resource="tokens", cost=1,
        )  # fmt: skip
        return [c.check.algorithm for c in checks]

    with caplog.at_level(logging.ERROR, logger="flask_quota"):
        assert algorithms(BIG) == [Algorithm.SLIDING_WINDOW_COUNTER]
        assert algorithms(BIG) == [Algorithm.SLIDING_WINDOW_COUNTER]
        assert algorithms(f"{MAX_LOG_LIMIT}/hour") == [Algorithm.SLIDING_WINDOW_LOG]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and BIG in errors[0] and "sliding_window_counter" in errors[0]


@pytest.mark.redis
@pytest.mark.quiet  # SLOWLOG times each command on the server's wall clock
def test_one_caller_cannot_grow_a_log_that_stalls_redis(
    tmp_path: Path, redis_client: redis.Redis
) -> None:
    """The report's attack on a real redis-server: @quota.limit("1000000/hour",
    cost=1000) with QUOTA_ALGORITHM=sliding_window_log, 41 requests from one IP. No key
    holds a list of more than MAX_LOG_LIMIT + 1 entries, and no decision takes 5 ms of
    Redis time (SLOWLOG, which times each command on the server)."""
    redis_client.flushall()
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        QUOTA_ALGORITHM="sliding_window_log",
        QUOTA_PLANS={"free": {"user": f"{MAX_LOG_LIMIT}/hour"}},
        QUOTA_DATABASE_URL=f"sqlite:///{tmp_path}/quota.sqlite3",
    )
    quota = Quota(app, storage=RedisStorage(redis_client))

    @app.get("/bulk")
    @quota.limit(BIG, cost=1000)
    def bulk() -> str:
        return "ok"

    old = redis_client.config_get("slowlog-*")
    redis_client.config_set("slowlog-log-slower-than", 0)
    redis_client.config_set("slowlog-max-len", 10_000)
    redis_client.slowlog_reset()
    try:
        http = app.test_client()
        statuses = [http.get("/bulk").status_code for _ in range(41)]
        durations = [
            e["duration"]
            for e in redis_client.slowlog_get(10_000)
            if e["command"].startswith((b"EVAL", b"FCALL"))  # the decide call
        ]
    finally:
        for name, value in old.items():
            redis_client.config_set(str(name), str(value))
    assert statuses == [200] * 41
    lists = [k for k in redis_client.keys("*") if redis_client.type(k) == b"list"]
    assert all(redis_client.llen(k) <= MAX_LOG_LIMIT + 1 for k in lists)
    assert len(durations) >= 41 and max(durations) < 5000, durations


@given(
    limit=st.integers(min_value=1, max_value=6),
    charges=st.lists(
        st.tuples(st.integers(min_value=0, max_value=90), st.integers(min_value=1, max_value=40)),
        min_size=1,
        max_size=6,
    ),
    later=st.integers(min_value=0, max_value=200),
    cost=st.integers(min_value=0, max_value=8),
)
def test_a_log_trimmed_to_limit_plus_one_decides_as_the_whole_log(
    limit: int, charges: list[tuple[int, int]], later: int, cost: int
) -> None:
    """Why a charge may keep only the newest limit + 1 entries (``bound_debt``): at any
    later time and for any cost, the trimmed log allows, waits and resets exactly as the
    untrimmed one; only ``remaining`` stops at -1 instead of going further below zero."""
    rate = Rate(limit, 60)
    now, whole, trimmed = 0, (), ()
    for gap, units in charges:
        now += gap * S
        whole = charge_log(whole or None, now, rate, units).state or ()
        state = charge_log(trimmed or None, now, rate, charged_units(LOG, rate, units)).state
        trimmed = bound_debt(LOG, state, 0, now, rate)[0]
    at = now + later * S
    exact, kept = (
        sliding_window_log(whole, at, rate, cost),
        sliding_window_log(trimmed, at, rate, cost),
    )
    assert (exact.allowed, exact.reset_us, exact.retry_after_us) == (
        kept.allowed, kept.reset_us, kept.retry_after_us
    )  # fmt: skip
    assert kept.remaining == max(exact.remaining, -1) and len(trimmed) <= limit + 1


def test_a_large_log_set_through_the_cli_never_reaches_the_storage(tmp_path: Path) -> None:
    """``flask quota plans set free user 1000000/hour --algorithm sliding_window_log``:
    either refused, or (the SQL row reaches the policy unchecked) the tier is kept on a
    sliding counter; in no case does the storage hold a log for it."""
    storage = MemoryStorage()
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config["QUOTA_DATABASE_URL"] = f"sqlite:///{tmp_path}/quota.sqlite3"
    quota = Quota(app, storage=storage)

    @app.get("/items")
    @quota.limit("100/minute")
    def items() -> str:
        return "items"

    args = ["plans", "set", "free", "user", BIG, "--algorithm", "sliding_window_log"]
    result = app.test_cli_runner().invoke(args=["quota", *args, "--actor", "alice"])
    http = app.test_client()
    assert [http.get("/items").status_code for _ in range(3)] == [200] * 3
    keys = list(storage._data)  # the memory store's keys name each tier's algorithm
    assert not any(k.endswith(":swl") for k in keys), keys
    if result.exit_code == 0:
        assert any(k.endswith(":u:swc") for k in keys), (keys, result.output)


def test_the_built_in_plans_start_under_a_sliding_log(
    app: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    """QUOTA_ALGORITHM=sliding_window_log without QUOTA_PLANS (Flask-Limiter's
    moving-window, ported) starts and serves: the built-in plans are not refused for
    their limits past the bound (enterprise's user 2000/minute, ai_tokens); those are
    enforced on a sliding counter, and any message about it says so."""
    app.config["QUOTA_ALGORITHM"] = "sliding_window_log"
    Quota(app)

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    client = app.test_client()
    with caplog.at_level(logging.ERROR, logger="flask_quota"):
        assert [client.get("/ping").status_code for _ in range(3)] == [200, 200, 200]
    assert all("sliding_window_counter" in r.getMessage() for r in caplog.records)
