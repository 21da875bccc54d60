"""The dashboard during a Redis outage: every page answers 200 and says the storage is down.

Each test runs the app against a redis-server of its own (``QUOTA_STORAGE_URL``, no
injected storage), sends some traffic while it is up, then stops or pauses it.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from tests.outage import OPS, TIMEOUT, redis_app, traffic_then_login
from tests.servers import RedisServer

PAGES = [
    "/quota/", "/quota/api/overview", "/quota/chart.svg", "/quota/chart.svg?identity=id=ada",
    "/quota/identity/id=ada", "/quota/api/identity/id=ada", "/quota/identity/ip=127.0.0.1",
    "/quota/api/identity/ip=127.0.0.1", "/quota/identity?q=ada", "/quota/plans",
    "/quota/clients", "/quota/audit",
]  # fmt: skip


def text(html: str) -> str:
    """What a reader sees of ``html``: tags dropped, whitespace collapsed."""
    return " ".join(re.sub("<[^>]+>", "", html).split())


def get(http: FlaskClient, url: str) -> tuple[int, str, float]:
    start = time.monotonic()
    response = http.get(url, headers=OPS, follow_redirects=True)
    return response.status_code, response.get_data(as_text=True), time.monotonic() - start


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
def test_pages_answer_and_show_the_outage_while_redis_is_stopped(
    tmp_path: Path, own_redis: RedisServer, fail_mode: str
) -> None:
    """With redis-server stopped, every page and API answers 200 and says "down"; the
    overview names the fail mode in effect and, once a request has tripped it, the
    open breaker."""
    app = redis_app(tmp_path, own_redis.url, QUOTA_FAIL_MODE=fail_mode)
    http = traffic_then_login(app)
    own_redis.stop()
    for url in PAGES:
        status, body, _ = get(http, url)
        assert status == 200, (url, status, body[:500])
        assert "down" in body.lower(), (url, body[:500])
    storage = http.get("/quota/api/overview", headers=OPS).get_json()["storage"]
    assert storage["status"] == "down" and storage["fail_mode"] == fail_mode
    assert storage["fail_mode_active"] and not storage["breaker_open"]
    # API requests meet the dead storage until the breaker opens; the page says so.
    expected = 200 if fail_mode == "open" else 503
    for _ in range(50):
        assert http.post("/infer", headers={"X-User": "ada"}).status_code == expected
        storage = http.get("/quota/api/overview", headers=OPS).get_json()["storage"]
        if storage["breaker_open"]:
            break
    assert storage["breaker_open"] and storage["status"] == "down", storage
    page = text(http.get("/quota/", headers=OPS).get_data(as_text=True))
    assert f"Storage redis is down (ConnectionError). Fail mode {fail_mode} is active" in page
    assert "circuit breaker is open" in page


def test_pages_stay_fast_while_redis_is_paused(tmp_path: Path, own_redis: RedisServer) -> None:
    """A hung Redis (CLIENT PAUSE) costs each page a few storage timeouts, not one per read
    and never a hang: every page answers 200, says "down", within 10 timeouts."""
    app = redis_app(tmp_path, own_redis.url)
    http = traffic_then_login(app)
    own_redis.pause(60_000)  # ends with the server, killed at teardown
    for url in PAGES:
        status, body, elapsed = get(http, url)
        assert status == 200, (url, status, body[:500])
        assert "down" in body.lower(), (url, body[:500])
        assert elapsed < 10 * TIMEOUT, (url, elapsed)


def test_recovery_shows_up_again(tmp_path: Path, own_redis: RedisServer) -> None:
    """When Redis comes back, the overview says "up" again without a restart."""
    app = redis_app(tmp_path, own_redis.url)
    http = traffic_then_login(app)
    own_redis.stop()
    assert http.get("/quota/api/overview", headers=OPS).get_json()["storage"]["status"] == "down"
    own_redis.start()
    deadline = time.monotonic() + 10
    while True:
        storage = http.get("/quota/api/overview", headers=OPS).get_json()["storage"]
        if storage["status"] == "up":
            break
        assert time.monotonic() < deadline, storage
        time.sleep(0.1)
    assert storage["latency_ms"] is not None and not storage["fail_mode_active"]


def test_the_overload_panel_says_unknown_while_redis_is_stopped(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """With overload protection on and redis-server stopped, the overview answers 200 and
    its overload panel says the in-flight counts are unknown (not zero, not a 500)."""
    app = redis_app(tmp_path, own_redis.url, QUOTA_CAPACITY=50)
    http = traffic_then_login(app)
    own_redis.stop()
    status, body, _ = get(http, "/quota/")
    assert status == 200, body[:500]
    assert "Overload protection Unknown while the storage is down." in text(body)
    overload = http.get("/quota/api/overview", headers=OPS).get_json()["overload"]
    assert overload == {"unavailable": True}
