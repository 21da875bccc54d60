"""The circuit breaker: a blip is not an outage, an outage still opens it.

The app-level tests run a real redis-server and stall it with ``CLIENT PAUSE``
under steady traffic; the unit tests drive ``CircuitBreaker`` with a clock of
their own so the state machine is checked step by step.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass

import pytest
from flask import Flask

from flask_quota import Quota
from flask_quota.settings import Settings
from flask_quota.storage.breaker import CircuitBreaker
from tests.servers import RedisServer

TIMEOUT = 0.05  # QUOTA_STORAGE_TIMEOUT, as in the report of the blip
STALL = 0.15  # one Redis stall, in seconds
BEFORE, AFTER = 0.4, 1.3  # steady traffic before the stall and after it (past the cooldown)
PLANS = {"p": {"global": "100000/second", "user": "100000/minute"}}


@dataclass(frozen=True)
class Reply:
    sent: float  # time.monotonic() when the request was sent
    status: int


def blip_app(app: Flask, server: RedisServer, **config: object) -> Flask:
    """``app`` answering /ping under generous limits on ``server``, failing closed."""
    app.config.update(
        QUOTA_STORAGE_URL=server.url,
        QUOTA_FAIL_MODE="closed",
        QUOTA_STORAGE_TIMEOUT=TIMEOUT,
        QUOTA_PLANS=PLANS,
        QUOTA_DEFAULT_PLAN="p",
        QUOTA_ANONYMOUS_PLAN="p",
        **config,
    )
    Quota(app)
    app.add_url_rule("/ping", "ping", lambda: "pong")
    return app


def traffic_with_a_stall(
    app: Flask, server: RedisServer, threads: int
) -> tuple[list[Reply], float]:
    """Steady requests from ``threads`` loops; Redis stalls once for STALL seconds.

    Returns every reply and the moment the stall began.
    """
    replies: list[Reply] = []
    lock = threading.Lock()
    start = time.monotonic()
    stall_at = start + BEFORE
    stop = stall_at + AFTER

    def loop() -> None:
        client = app.test_client()  # one client per thread, as one per worker thread
        while (now := time.monotonic()) < stop:
            status = client.get("/ping").status_code
            with lock:
                replies.append(Reply(now, status))

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for worker in workers:
        worker.start()
    time.sleep(max(0.0, stall_at - time.monotonic()))
    stall_at = time.monotonic()
    server.pause(int(STALL * 1000))
    for worker in workers:
        worker.join(timeout=30)
    return replies, stall_at


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.quiet  # counts the 503s of a 150 ms stall: a loaded machine stretches it
@pytest.mark.parametrize("threads", [1, 4])
def test_a_short_stall_costs_a_few_503s_not_a_second_of_them(
    app: Flask, own_redis: RedisServer, caplog: pytest.LogCaptureFixture, threads: int
) -> None:
    """QUOTA_FAIL_MODE=closed, 50 ms timeout, one 150 ms CLIENT PAUSE under steady traffic:
    only requests that hit the stall get 503 (at most 10 from one worker thread), the
    breaker never opens, and 200s resume as soon as Redis answers again."""
    caplog.set_level(logging.INFO, logger="flask_quota")
    blip_app(app, own_redis)
    assert app.test_client().get("/ping").status_code == 200  # connection and script ready

    replies, stall_at = traffic_with_a_stall(app, own_redis, threads)
    statuses = Counter(r.status for r in replies)
    late = [r.sent - stall_at for r in replies if r.status == 503 and r.sent > stall_at + 0.5]
    print(f"{threads} thread(s): {statuses[200]} x 200, {statuses[503]} x 503")

    assert set(statuses) <= {200, 503}, statuses
    assert statuses[503] >= 1, "the stall went unnoticed: the test proves nothing"
    if threads == 1:
        assert statuses[503] <= 10, statuses
    assert not late, f"503s long after the stall ended: {late[:5]}"
    assert statuses[200] > 10 * statuses[503]
    opened = [r for r in caplog.records if r.name == "flask_quota" and r.levelno >= logging.ERROR]
    assert not opened, [r.getMessage() for r in opened]


# -- the state machine, on a clock of our own ------------------------------------------


class Clock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


ERROR = OSError("timeout")


def breaker_logs(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [r.levelno for r in caplog.records if r.name == "flask_quota" and r.levelno > 10]


def fail_once(breaker: CircuitBreaker) -> None:
    attempt = breaker.allow()
    assert attempt is not None
    breaker.failed(attempt, ERROR, "closed")


def test_opens_after_threshold_failures_in_a_row(caplog: pytest.LogCaptureFixture) -> None:
    """Threshold 3: two failures leave it closed, a success starts the count again,
    three in a row open it, with one ERROR line naming the count."""
    caplog.set_level(logging.DEBUG, logger="flask_quota")
    breaker = CircuitBreaker("redis", threshold=3, clock=Clock())
    fail_once(breaker)
    fail_once(breaker)
    assert not breaker.is_open and breaker.allow() is not None
    breaker.succeeded()
    fail_once(breaker)
    fail_once(breaker)
    assert not breaker.is_open
    fail_once(breaker)
    assert breaker.is_open
    assert breaker_logs(caplog) == [logging.ERROR]
    assert "failed 3 times in a row" in caplog.records[-1].getMessage()


def test_threshold_one_opens_on_the_first_failure() -> None:
    """QUOTA_BREAKER_THRESHOLD=1 keeps the old behaviour: the first failure opens it."""
    breaker = CircuitBreaker("redis", threshold=1, clock=Clock())
    fail_once(breaker)
    assert breaker.is_open


def test_calls_that_fail_together_count_once() -> None:
    """Calls in flight together that fail together (one stall, many threads) are one
    failure: only a call begun after the last counted failure counts again."""
    breaker = CircuitBreaker("redis", threshold=2, clock=Clock())
    together = [breaker.allow() for _ in range(8)]
    for attempt in together:
        assert attempt is not None
        breaker.failed(attempt, ERROR, "closed")
    assert not breaker.is_open  # eight threads, one stall: one failure
    fail_once(breaker)  # a call begun after it: the second failure in a row
    assert breaker.is_open


def test_open_breaker_probes_once_per_cooldown(caplog: pytest.LogCaptureFixture) -> None:
    """Open: no call until the cooldown has passed, then exactly one probe; a failed
    probe waits another cooldown; a good one closes it with one WARNING line."""
    caplog.set_level(logging.INFO, logger="flask_quota")
    clock = Clock()
    breaker = CircuitBreaker("redis", threshold=1, cooldown=2.0, clock=clock)
    fail_once(breaker)
    assert breaker.allow() is None and breaker.seconds_to_probe() == 2.0
    clock.now += 2.0
    probe = breaker.allow()
    assert probe is not None and probe.probe
    assert breaker.allow() is None  # one probe per cooldown
    clock.now += 0.5
    breaker.failed(probe, ERROR, "closed")
    assert breaker.is_open and breaker.seconds_to_probe() == 2.0
    clock.now += 2.0
    probe = breaker.allow()
    assert probe is not None and probe.probe
    breaker.succeeded()
    assert not breaker.is_open and breaker.seconds_to_probe() == 0.0
    attempt = breaker.allow()
    assert attempt is not None and not attempt.probe
    assert breaker_logs(caplog) == [logging.ERROR, logging.WARNING]


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "x", "", "1e3", "\u0663", None])
def test_threshold_setting_rejects_anything_but_a_positive_whole_number(bad: object) -> None:
    """QUOTA_BREAKER_THRESHOLD must be a whole number >= 1; anything else names the key."""
    with pytest.raises(ValueError, match=r"QUOTA_BREAKER_THRESHOLD=.*at least 1"):
        Settings.from_config({"QUOTA_BREAKER_THRESHOLD": bad})


@pytest.mark.parametrize(("value", "expected"), [(None, 5), (1, 1), ("3", 3), (" 12 ", 12)])
def test_threshold_setting_accepts_ints_and_digit_strings(value: object, expected: int) -> None:
    """An int, or digits as environment variables carry them; 5 when unset."""
    config = {} if value is None else {"QUOTA_BREAKER_THRESHOLD": value}
    assert Settings.from_config(config).breaker_threshold == expected


def test_threshold_setting_reaches_the_breaker(app: Flask) -> None:
    """QUOTA_BREAKER_THRESHOLD is the threshold of the app's circuit breaker."""
    app.config["QUOTA_BREAKER_THRESHOLD"] = 2
    Quota(app)
    assert app.extensions["quota"].guard.breaker.threshold == 2
