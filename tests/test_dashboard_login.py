"""The dashboard's Basic-auth login throttle: failures are charged before the password is
checked, a correct password costs nothing, and unknown users cost a hash like real ones.

The throttle's budget is per IP, or per browser that has logged in before (a signed
cookie), so guesses from the operator's own NAT cannot lock the operator out.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.security import generate_password_hash

from flask_quota.dashboard.auth import DEVICE_COOKIE, Authenticator
from flask_quota.storage.redis import RedisStorage
from tests.dashboards import OPS, PASSWORD, basic, dashboard_app
from tests.servers import RedisServer

NAT = {"REMOTE_ADDR": "198.51.100.7"}  # the operator and the guesser share this address
# A cheap hash keeps these tests quick; the timing test uses Werkzeug's default.
FAST = generate_password_hash(PASSWORD, method="pbkdf2:sha256:20000")


def login(http: FlaskClient, password: str, *, user: str = "ops", env: dict[str, str] = NAT) -> int:
    """The status of one dashboard request with these Basic credentials."""
    return http.get("/quota/", headers=basic(user, password), environ_base=env).status_code


def authenticator(app: Flask) -> Authenticator:
    auth: Authenticator = app.extensions["quota_dashboard"]
    return auth


class Counting:
    """Wraps the authenticator's password verifier and counts its calls."""

    def __init__(self, auth: Authenticator) -> None:
        self.calls = 0
        self._lock = threading.Lock()
        self._inner: Callable[[str, str], bool] = auth.verifier
        auth.verifier = self

    def __call__(self, stored: str, password: str) -> bool:
        with self._lock:
            self.calls += 1
        return self._inner(stored, password)


@pytest.fixture(params=["memory", "redis"])
def storage_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The login throttle's storage: in-process, or a real redis-server shared by workers."""
    if request.param == "memory":
        yield None
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        client = server.client()
        client.flushall()
        client.close()
        yield server.url


@pytest.fixture
def ops_app_config() -> dict[str, Any]:
    """Here ``ops_app``'s operator logs in against the cheap ``FAST`` hash."""
    return {"QUOTA_DASHBOARD_USERS": {"ops": FAST}}


def make_app(tmp_path: Path, storage_url: str | None, password_hash: str = FAST) -> Flask:
    storage = None if storage_url is None else RedisStorage.from_url(storage_url, timeout=5)
    return dashboard_app(tmp_path, QUOTA_DASHBOARD_USERS={"ops": password_hash}, storage=storage)


def test_operator_browser_gets_in_while_its_ip_is_throttled(
    tmp_path: Path, storage_url: str | None
) -> None:
    """Ten wrong passwords from the operator's IP throttle that IP, yet the operator's
    browser (it logged in before, on another worker) still gets in with the right one."""
    earlier, worker = make_app(tmp_path / "a", storage_url), make_app(tmp_path / "b", storage_url)
    browser = earlier.test_client()
    assert browser.get("/quota/", headers=OPS, environ_base=NAT).status_code == 200
    assert browser.get_cookie(DEVICE_COOKIE, path="/quota/") is not None
    guesser = worker.test_client()
    for i in range(10):
        wrong = guesser.get("/quota/", headers=basic("ops", f"guess{i}"), environ_base=NAT)
        assert wrong.status_code == 401
    assert guesser.get("/quota/", headers=basic("ops", "x"), environ_base=NAT).status_code == 429
    # The guesser cannot test a password while throttled, not even the right one...
    assert guesser.get("/quota/", headers=OPS, environ_base=NAT).status_code == 429
    # ...but the operator's browser, on the worker that never saw it, gets in.
    cookie = browser.get_cookie(DEVICE_COOKIE, path="/quota/")
    assert cookie is not None
    operator = worker.test_client()
    operator.set_cookie(DEVICE_COOKIE, cookie.value, path="/quota/")
    assert operator.get("/quota/", headers=OPS, environ_base=NAT).status_code == 200


def test_device_cookie_is_signed_and_per_user(tmp_path: Path) -> None:
    """A forged device cookie, or one issued to another user, buys no budget of its own."""
    app = dashboard_app(tmp_path, QUOTA_DASHBOARD_USERS={"ops": FAST, "eve": FAST})
    eve = app.test_client()
    assert login(eve, PASSWORD, user="eve", env={"REMOTE_ADDR": "192.0.2.1"}) == 200
    eves = eve.get_cookie(DEVICE_COOKIE, path="/quota/")
    assert eves is not None
    http = app.test_client()
    for i in range(10):
        assert login(http, f"guess{i}") == 401
    for cookie in ("ops.1234", "garbage", eves.value):
        http.set_cookie(DEVICE_COOKIE, cookie, path="/quota/")
        assert login(http, PASSWORD) == 429


def test_device_budget_still_limits_guesses(ops_app: Flask) -> None:
    """A browser with a device cookie gets ten wrong passwords too, then waits."""
    http = ops_app.test_client()
    assert login(http, PASSWORD) == 200
    assert http.get_cookie(DEVICE_COOKIE, path="/quota/") is not None
    assert [login(http, f"g{i}") for i in range(11)] == [401] * 10 + [429]


def test_correct_password_is_not_charged(ops_app: Flask) -> None:
    """A correct password is charged before it is checked and refunded after: nine
    failures, a success, then the tenth failure is still answered 401."""
    http = ops_app.test_client()
    counting = Counting(authenticator(ops_app))
    assert [login(http, f"g{i}") for i in range(9)] == [401] * 9
    assert login(http, PASSWORD) == 200
    assert counting.calls == 10  # the success was verified (not answered from a cache)
    http.delete_cookie(DEVICE_COOKIE, path="/quota/")  # back to the IP's budget
    assert [login(http, "g9"), login(http, "g10")] == [401, 429]


def test_concurrent_guesses_check_at_most_the_limit(
    tmp_path: Path, storage_url: str | None
) -> None:
    """60 wrong passwords sent at once from one IP: at most 10 reach the password check
    (each is charged before it is checked); the rest are answered 429."""
    app = make_app(tmp_path, storage_url)
    counting = Counting(authenticator(app))
    barrier = threading.Barrier(60)
    codes: list[int] = []
    lock = threading.Lock()

    def guess(i: int) -> None:
        http = app.test_client()
        barrier.wait()
        code = http.get("/quota/", headers=basic("ops", f"guess{i}"), environ_base=NAT).status_code
        with lock:
            codes.append(code)

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(60)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(codes) == 60
    assert counting.calls <= 10, counting.calls
    assert codes.count(401) == counting.calls and codes.count(429) == 60 - counting.calls
    assert counting.calls >= 9  # the budget was spent, not refused wholesale


def test_unknown_user_costs_a_password_hash(tmp_path: Path) -> None:
    """A login as an unknown user is checked against a dummy hash of the same method,
    so it takes about as long as a wrong password for a real user (median of 5 each), with
    Werkzeug's default method (scrypt), as operators' hashes are made."""
    app = make_app(tmp_path, None, password_hash=generate_password_hash(PASSWORD))
    http = app.test_client()
    counting = Counting(authenticator(app))

    def seconds(user: str, i: int) -> float:
        env = {"REMOTE_ADDR": f"203.0.113.{i}"}  # a fresh IP each: never throttled
        start = time.perf_counter()
        assert login(http, "wrong", user=user, env=env) == 401
        return time.perf_counter() - start

    known, unknown = [], []
    for i in range(5):
        known.append(seconds("ops", 2 * i))
        unknown.append(seconds("nobody", 2 * i + 1))
    assert counting.calls == 10
    ratio = statistics.median(unknown) / statistics.median(known)
    assert 0.5 < ratio < 2.0, (known, unknown)
