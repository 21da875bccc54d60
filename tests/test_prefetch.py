"""QUOTA_PREFETCH through the app, on a real redis-server: fewer decide calls, the
limit never exceeded, and resets, blocks, plan changes and fail modes as without.
The property itself (no interleaving over-admits) is ``tests/test_prefetch_model.py``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import redis
from flask import Flask

from flask_quota import Identity, Quota
from flask_quota.core.algorithms import Algorithm, Gate
from flask_quota.core.checks import Check
from flask_quota.core.errors import QuotaUnavailable
from flask_quota.core.rates import Rate
from flask_quota.core.reply import Reply
from flask_quota.settings import FailMode
from flask_quota.storage.base import StorageError, Verdict
from flask_quota.storage.breaker import CircuitBreaker
from flask_quota.storage.failover import GuardedStorage
from flask_quota.storage.memory import MemoryStorage
from flask_quota.storage.prefetch import Prefetch
from tests.cluster import master_calls
from tests.redis_probes import decide_calls
from tests.servers import RedisServer

pytestmark = pytest.mark.redis

LOG = {"rate": "1000/minute", "algorithm": "sliding_window_log"}
PLANS = {
    "free": {
        "user": "1000/minute",
        "global": "100000/minute",
        "resources": {"small": "40/minute", "log": LOG},
    },
    "pro": {
        "user": "3000/minute",
        "global": "100000/minute",
        "resources": {"small": "80/minute", "log": LOG},
    },
}


def make_app(url: str, **config: Any) -> tuple[Flask, Quota]:
    app = Flask(__name__)
    app.config.update(
        {
            "QUOTA_STORAGE_URL": url,
            "QUOTA_PLANS": PLANS,
            "QUOTA_DATABASE_URL": "sqlite://",
            "QUOTA_PREFETCH": 0.05,
            **config,
        }
    )
    quota = Quota(app)
    plan = {"name": "free"}

    @quota.identity_loader
    def caller() -> Identity:
        return Identity("acct-1", plan["name"])

    @app.get("/ping")
    def ping() -> str:
        return "pong"

    @app.get("/small")
    @quota.limit(resource="small")
    def small() -> str:
        return "ok"

    @app.get("/log")
    @quota.limit(resource="log")
    def log() -> str:
        return "ok"

    app.config["TEST_PLAN"] = plan
    return app, quota


@pytest.fixture
def redis_url(redis_server: RedisServer, redis_client: redis.Redis) -> Iterator[str]:
    redis_client.config_resetstat()
    yield redis_server.url


# Quiet: a share's size follows the caller's pace (a full bucket's share lasts about one
# refill interval), so under a parallel run's load the test client's slower requests
# took 233 calls of 400 where alone they take under 60.
@pytest.mark.quiet
def test_a_busy_caller_costs_a_fraction_of_the_decide_calls(
    redis_url: str, redis_client: redis.Redis
) -> None:
    app, _ = make_app(redis_url)
    client = app.test_client()
    statuses = [client.get("/ping").status_code for _ in range(400)]
    assert statuses == [200] * 400
    calls = decide_calls(redis_client)
    assert calls < 400 * 0.15, calls  # exact mode: 400
    # The headers still speak: approximate, but a bucket of the plan's size.
    response = client.get("/ping")
    assert response.headers["X-RateLimit-Limit"] == "1000"
    assert 0 < int(response.headers["X-RateLimit-Remaining"]) < 1000


def test_without_prefetch_every_request_asks_the_storage(
    redis_url: str, redis_client: redis.Redis
) -> None:
    """The count above can fail: the same traffic, exact, is one call a request."""
    app, _ = make_app(redis_url, QUOTA_PREFETCH=None)
    client = app.test_client()
    for _ in range(50):
        assert client.get("/ping").status_code == 200
    assert decide_calls(redis_client) == 50


def test_the_limit_is_never_exceeded_and_nearly_reached(redis_url: str) -> None:
    app, _ = make_app(redis_url)
    client = app.test_client()
    statuses = [client.get("/small").status_code for _ in range(80)]
    admitted = statuses.count(200)
    assert set(statuses) <= {200, 429}
    assert 36 <= admitted <= 40, statuses


def test_a_sliding_window_is_decided_in_storage_every_time(
    redis_url: str, redis_client: redis.Redis
) -> None:
    app, _ = make_app(redis_url)
    client = app.test_client()
    for _ in range(30):
        assert client.get("/log").status_code == 200
    assert decide_calls(redis_client) == 30


def test_a_reset_gives_the_bucket_back_at_once(redis_url: str) -> None:
    app, quota = make_app(redis_url)
    client = app.test_client()
    while client.get("/small").status_code == 200:
        pass
    with app.app_context():
        quota.reset(identity="acct-1")
    assert client.get("/small").status_code == 200


def test_a_block_applies_to_the_next_request(redis_url: str) -> None:
    app, quota = make_app(redis_url)
    client = app.test_client()
    for _ in range(20):
        assert client.get("/ping").status_code == 200  # shares in hand
    with app.app_context():
        quota.block(identity="acct-1", seconds=60, reason="test")
    response = client.get("/ping")
    assert response.status_code == 429
    assert "blocked" in response.get_json()["detail"].lower()


def test_a_plan_change_applies_to_the_next_request(redis_url: str) -> None:
    """Shares of the old plan's bucket are not spent under the new one: the limit the
    headers name is the new plan's at once (the rate differs, so the share does not
    apply, and the worker forgets all shares when the SQL version moves)."""
    app, _ = make_app(redis_url)
    client = app.test_client()
    for _ in range(20):
        assert client.get("/ping").headers["X-RateLimit-Limit"] == "1000"
    app.config["TEST_PLAN"]["name"] = "pro"
    assert client.get("/ping").headers["X-RateLimit-Limit"] == "3000"


def test_closed_mode_spends_shares_in_hand_then_refuses(tmp_path: Any) -> None:
    """Shares were charged in storage before it died: spending them admits nothing the
    limit did not allow. Once they run out, the fail mode decides. (Fixed windows: their
    shares last the sync interval here, where a token bucket's near full may last
    milliseconds, shorter than killing a server takes.)"""
    server = RedisServer(tmp_path)  # started
    try:
        app, _ = make_app(
            server.url,
            QUOTA_FAIL_MODE="closed",
            QUOTA_SYNC_INTERVAL=1.5,
            QUOTA_ALGORITHM="fixed_window",
        )
        client = app.test_client()
        prefetch = app.extensions["quota"].storage.storage  # below the deny cache
        assert isinstance(prefetch, Prefetch)
        for _ in range(200):  # until both tiers have a share in hand
            assert client.get("/ping").status_code == 200
            held = prefetch.held()
            if len(held) == 2:
                break
        server.kill()
        statuses = [client.get("/ping").status_code for _ in range(100)]
    finally:
        server.stop()
    # Both tiers (global and user) must have a share for a request to pass without Redis.
    assert len(held) == 2, held
    in_hand = min(held.values())
    assert statuses == [200] * in_hand + [503] * (100 - in_hand), held


@pytest.mark.parametrize("value", [0, -0.1, 0.6, 1, "x", True, float("nan")])
def test_bad_prefetch_values_are_refused_naming_the_key(value: object) -> None:
    app = Flask(__name__)
    app.config.update(QUOTA_PREFETCH=value, QUOTA_DATABASE_URL="sqlite://")
    with pytest.raises(ValueError, match="QUOTA_PREFETCH"):
        Quota(app)


@pytest.mark.parametrize("value", [None, "off", "", "0.05", 0.5])
def test_prefetch_values_that_are_accepted(value: object) -> None:
    app = Flask(__name__)
    app.config.update(QUOTA_PREFETCH=value, QUOTA_DATABASE_URL="sqlite://")
    Quota(app)


def test_metrics_count_the_decisions_answered_from_shares(redis_url: str) -> None:
    app, _ = make_app(redis_url, QUOTA_METRICS_URL="/metrics")
    client = app.test_client()
    for _ in range(100):
        assert client.get("/ping").status_code == 200
    prefetch = app.extensions["quota"].storage.storage
    assert isinstance(prefetch, Prefetch) and prefetch.local > 0
    text = client.get("/metrics").get_data(as_text=True)
    line = next(x for x in text.splitlines() if x.startswith("flask_quota_prefetch_hits_total"))
    assert float(line.split()[-1]) == prefetch.local
    decided = [
        x for x in text.splitlines()
        if x.startswith("flask_quota_decisions_total") and 'tier="user"' in x
    ]  # fmt: skip
    assert sum(float(x.split()[-1]) for x in decided) == 100  # counted like any decision


def test_on_a_cluster_shares_span_slots_and_the_limit_holds(cluster: Any) -> None:
    """The caller's tiers sit in two slots (its address's and its identity's): a share
    taken in one call that one slot refuses is refunded in the other (all-or-nothing),
    and the limit holds as on one node."""

    def calls(client: Any) -> int:
        """The decide calls of 200 quick requests, as the cluster's masters count them."""
        before = master_calls(cluster)
        assert [client.get("/ping").status_code for _ in range(200)] == [200] * 200
        return master_calls(cluster) - before

    # Exact, two calls a request (one per slot); with shares, fewer. How many fewer
    # depends on the requests' pace (a share is sized to what can be spent before it
    # expires): under 60 of about 400 on a quiet machine, 310 of 402 once under the load
    # of a parallel test run. So the exact app is counted beside it, and the test asks
    # only that shares were spent.
    exact = calls(make_app(cluster.url, QUOTA_PREFETCH=None)[0].test_client())
    app, _ = make_app(cluster.url)
    client = app.test_client()
    assert exact >= 400
    assert calls(client) < exact
    statuses = [client.get("/small").status_code for _ in range(80)]
    assert 36 <= statuses.count(200) <= 40, statuses


class _Down(MemoryStorage):
    """A memory storage that can be taken down: its decide calls then raise."""

    down = False

    def decide_flat(
        self, checks: Sequence[Check], keys: Sequence[str], *, commit: bool = True
    ) -> Reply:
        if self.down:
            raise StorageError("memory: down (test)")
        return super().decide_flat(checks, keys, commit=commit)


def _unit(tag: str) -> tuple[Check, ...]:
    rate = Rate(100000, 60)
    return (
        Check(f"q:blk:{tag}", Gate.BLOCK, Rate(1, 1), 0),
        Check(f"q:u:{tag}", Algorithm.TOKEN_BUCKET, rate, 1),
    )


def test_answers_from_shares_are_no_sign_the_storage_is_up() -> None:
    """While the storage is down, a caller with shares in hand is still answered, but
    those answers must not reset the breaker's run of failures: the callers without
    shares must see the breaker open after the threshold, not wait out every call."""
    storage = _Down()
    prefetch = Prefetch(storage, fraction=0.05, horizon=60)
    breaker = CircuitBreaker("memory", threshold=5)
    guard = GuardedStorage(prefetch, FailMode.CLOSED, breaker)
    busy, cold = _unit("busy"), _unit("cold")
    keys = [c.key for c in busy]
    while not prefetch.held():
        assert guard.decide_flat(busy, keys) is not None
    storage.down = True
    for _ in range(5):
        assert guard.decide_flat(busy, keys) is not None  # from the share in hand
        with pytest.raises(QuotaUnavailable):
            guard.decide_flat(cold, [c.key for c in cold])
    assert breaker.is_open


def test_other_callers_of_decide_are_decided_exactly() -> None:
    """QUOTA_BLOCK_AFTER counts denials with ``decide`` (not the request path): each of
    its calls must reach the storage, or shares would count as denials taken ahead."""
    storage = MemoryStorage()
    calls: list[int] = []
    real = storage.decide

    def counted(checks: Sequence[Check]) -> Verdict:
        calls.append(1)
        return real(checks)

    storage.decide = counted  # type: ignore[method-assign]
    prefetch = Prefetch(storage, fraction=0.5, horizon=60)
    for _ in range(20):
        prefetch.decide(list(_unit("x")))
    assert len(calls) == 20


def test_a_block_while_a_take_is_in_flight_is_not_forgotten() -> None:
    """``quota.block`` in another thread lands between a call's send and its answer: the
    answer read the gate open, but the block came after. Trusting that "not blocked"
    would let the caller spend its shares through the block (a per-key forget time)."""
    storage = MemoryStorage()
    prefetch = Prefetch(storage, fraction=0.5, horizon=60)
    checks = _unit("r")
    keys = [c.key for c in checks]
    real = storage.decide_flat
    blocked: list[int] = []
    request = checks  # named apart from the storage call's own ``checks``

    def block_during_a_take(
        checks: Sequence[Check], keys: Sequence[str], *, commit: bool = True
    ) -> Reply:
        reply = real(checks, keys, commit=commit)
        if checks[1].cost > request[1].cost and not blocked:  # this call takes a share
            blocked.append(1)
            prefetch.block(request[0].key, 60, "{}")  # the block, while the call is in flight
        return reply

    storage.decide_flat = block_during_a_take  # type: ignore[method-assign]
    for _ in range(50):
        reply = prefetch.decide_flat(checks, keys)
        if blocked:
            break
    assert blocked, "a share was asked for"
    assert reply.all_allowed  # decided before the block
    assert not prefetch.decide_flat(checks, keys).all_allowed  # and the next one sees it


@pytest.mark.parametrize("rate", [Rate(1_000_000, 3600), Rate(1_000_000, 60)])
def test_shares_stay_worth_taking_when_the_bucket_refills_faster_than_a_worker_spends(
    rate: Rate,
) -> None:
    """High limits, the usual case: four workers share a caller's 400 requests a second,
    so each spends a share slower than the bucket refills, and the bucket stays near
    full. A share must then burn a guard large enough to be spent at the worker's pace;
    a guard no larger than the share made each share expire mostly unspent, halving
    the next, until nearly every request asked the storage again."""
    now = [1_800_000_000_000_000]
    storage = MemoryStorage(clock=lambda: now[0])
    calls = [0]
    real = storage.decide_flat

    def counted(checks: Sequence[Check], keys: Sequence[str], *, commit: bool = True) -> Reply:
        calls[0] += 1
        return real(checks, keys, commit=commit)

    storage.decide_flat = counted  # type: ignore[method-assign]
    workers = [
        Prefetch(storage, fraction=0.05, horizon=1.5, clock=lambda: now[0] / 1e6) for _ in range(4)
    ]
    checks = (
        Check("q:blk:u", Gate.BLOCK, Rate(1, 1), 0),
        Check("q:u:u", Algorithm.TOKEN_BUCKET, rate, 1),
    )
    keys = [c.key for c in checks]
    requests = 4000  # ten seconds
    for i in range(requests):
        now[0] += 2_500  # 400 a second, dealt to the workers in turn
        assert workers[i % 4].decide_flat(checks, keys).all_allowed
        if i == requests // 2:
            calls[0], settled = 0, i
    # Settled, each worker asks about once per share (its horizon's worth of requests).
    per_request = calls[0] / (requests - settled - 1)
    assert per_request < 0.02, per_request


@pytest.mark.parametrize("step_us", [0, 400_000], ids=["clock-still", "clock-moving"])
def test_a_bucket_is_known_from_its_second_request_within_the_horizon(step_us: int) -> None:
    """The first request of a bucket only notes it; the second within the horizon makes
    it known and the third takes a share. A clock that did not move in between (a
    coarse one) must not pass the second for the first."""
    now = [1_800_000_000_000_000]
    prefetch = Prefetch(MemoryStorage(clock=lambda: now[0]), fraction=0.5, horizon=1.5,
                        clock=lambda: now[0] / 1e6)  # fmt: skip
    checks = _unit("second")
    keys = [c.key for c in checks]
    for holds in (False, False, True):
        assert prefetch.decide_flat(checks, keys).all_allowed
        assert (prefetch.held().get(checks[1].key, 0) > 0) is holds
        now[0] += step_us


def test_a_caller_seen_less_often_than_the_horizon_never_takes_a_share() -> None:
    """A cold caller (each bucket asked once per horizon or less) is decided in storage
    every time, and what the worker keeps of it is one note per bucket at most."""
    now = [1_800_000_000_000_000]
    storage = MemoryStorage(clock=lambda: now[0])
    prefetch = Prefetch(storage, fraction=0.5, horizon=1.5, clock=lambda: now[0] / 1e6)
    checks = _unit("cold")
    keys = [c.key for c in checks]
    for _ in range(5):
        assert prefetch.decide_flat(checks, keys).all_allowed
        assert prefetch.held() == {} and len(prefetch) == 0
        now[0] += 1_600_000  # just past the horizon
    assert prefetch.local == 0
    assert storage.peek(list(checks)).outcomes[1].remaining == 100_000 - 1  # refilled: exact


def test_a_thread_that_waited_for_the_lock_judges_a_share_by_the_time_it_got_it() -> None:
    """A share past its deadline is never spent: a thread that read the clock, then waited
    for the worker's lock while the deadline passed, must not spend it by the time it read
    (under load a gthread worker's thread can wait that long; seen as one unit over the
    exact bucket in CI)."""
    now = [1_800_000_000_000_000]
    storage = MemoryStorage(clock=lambda: now[0])
    prefetch = Prefetch(storage, fraction=0.5, horizon=1.5, clock=lambda: now[0] / 1e6)
    checks = _unit("late")
    keys = [c.key for c in checks]
    for _ in range(3):  # noted, known, then a share is taken
        assert prefetch.decide_flat(checks, keys).all_allowed
    assert prefetch.held().get(checks[1].key, 0) > 0
    spent_before = prefetch.local
    done = threading.Event()

    def late() -> None:
        prefetch.decide_flat(checks, keys)
        done.set()

    with prefetch._lock:  # another thread holds the worker's lock
        worker = threading.Thread(target=late)
        worker.start()
        time.sleep(0.2)  # it has read the clock and waits for the lock
        now[0] += 2_000_000  # meanwhile every share's deadline (the horizon) passes
    worker.join(timeout=5)
    assert done.is_set()
    assert prefetch.local == spent_before  # decided in storage, not from the stale share
