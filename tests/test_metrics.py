"""Prometheus metrics in one process: what is counted, the route, the settings.

Under several gunicorn workers: tests/test_metrics_gunicorn.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, request
from flask.testing import FlaskClient

from flask_quota import Identity, Quota
from flask_quota.settings import Settings
from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock
from tests.helpers import infer_and_items
from tests.prom import Scrape
from tests.servers import ROOT, RedisServer

PLANS = {
    "free": {
        "global": "100/minute",
        "user": "100/minute",
        "resources": {"ai_inference": "2/minute"},
    },
}
RATE_HEADERS = ("X-RateLimit-Limit", "RateLimit", "RateLimit-Policy")


def metered_app(app: Flask, storage: MemoryStorage | None = None, **config: Any) -> Quota:
    """``/infer`` (global, user and endpoint tiers) and ``/items`` (global and user);
    callers name themselves in X-Client; metrics at /metrics."""
    app.config.update(
        {
            "QUOTA_PLANS": PLANS,
            "QUOTA_METRICS_URL": "/metrics",
            "QUOTA_DATABASE_URL": f"sqlite:///{app.instance_path}/quota.sqlite3",
            **config,
        }
    )
    quota = Quota(app, storage=storage)

    @quota.identity_loader
    def from_header() -> Identity | None:
        client = request.headers.get("X-Client")
        return Identity(client) if client else None

    infer_and_items(app, quota)

    return quota


def scrape(client: FlaskClient) -> Scrape:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.mimetype == "text/plain"
    return Scrape.parse(response.get_data(as_text=True))


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter (nothing imported yet), from the repository root."""
    clean = {k: v for k, v in os.environ.items() if not k.lower().startswith("prometheus_")}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


APP_WITH = """
import sys
from flask import Flask
from flask_quota import Quota
app = Flask("x", instance_path={instance!r})
app.config.update({config})
Quota(app)
print("prometheus_client" in sys.modules, sorted(r.rule for r in app.url_map.iter_rules()))
"""


def test_metrics_are_off_by_default_and_prometheus_client_is_never_imported(
    tmp_path: Path,
) -> None:
    """Without QUOTA_METRICS_URL no route is added and prometheus_client is not loaded."""
    result = run_python(APP_WITH.format(instance=str(tmp_path), config="{}"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False ['/static/<path:filename>']"
    with_metrics = APP_WITH.format(instance=str(tmp_path), config="QUOTA_METRICS_URL='/m'")
    result = run_python(with_metrics)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True ['/m', '/static/<path:filename>']"


def test_missing_prometheus_client_names_the_extra(tmp_path: Path) -> None:
    """QUOTA_METRICS_URL without prometheus_client installed: init_app says what to install."""
    code = "import sys; sys.modules['prometheus_client'] = None\n" + APP_WITH.format(
        instance=str(tmp_path), config="QUOTA_METRICS_URL='/metrics'"
    )
    result = run_python(code)
    assert result.returncode != 0
    assert "ValueError: QUOTA_METRICS_URL='/metrics' needs prometheus_client" in result.stderr
    assert "pip install 'flask-quota[metrics]'" in result.stderr


@pytest.mark.parametrize("value", ["metrics", " /metrics", 5, True])
def test_metrics_url_must_be_a_path(value: object) -> None:
    """A QUOTA_METRICS_URL that is not a path starting with '/' fails naming the key."""
    with pytest.raises(ValueError, match=r"QUOTA_METRICS_URL=.* must be a path starting with '/'"):
        Settings.from_config({"QUOTA_METRICS_URL": value})


@pytest.mark.parametrize("value", [None, ""])
def test_an_empty_metrics_url_means_no_metrics(value: object) -> None:
    """None or "" (an empty environment variable): no metrics."""
    assert Settings.from_config({"QUOTA_METRICS_URL": value}).metrics_url is None


def test_multiproc_dir_set_after_import_is_an_error(
    app: Flask, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PROMETHEUS_MULTIPROC_DIR set after prometheus_client was imported cannot work:
    init_app says so instead of silently counting per process."""
    import prometheus_client  # noqa: F401  (imported before the variable is set)

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="set it in the environment before the server starts"):
        metered_app(app)


def test_multiproc_dir_must_be_a_writable_directory(tmp_path: Path) -> None:
    """A PROMETHEUS_MULTIPROC_DIR that does not exist fails at start, naming the fix."""
    code = APP_WITH.format(instance=str(tmp_path), config="QUOTA_METRICS_URL='/metrics'")
    result = run_python(code, PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "missing"))
    assert result.returncode != 0
    assert "is not a writable directory; create an empty one" in result.stderr


SCRAPE = """
from flask import Flask
from flask_quota import Quota
app = Flask("x", instance_path={instance!r})
app.config.update(QUOTA_METRICS_URL="/metrics")
Quota(app)
response = app.test_client().get("/metrics")
print(response.status_code)
print(response.get_data(as_text=True))
"""


def test_a_scrape_while_a_worker_boots_still_answers(tmp_path: Path) -> None:
    """A worker that gunicorn is booting creates its files in the multiprocess directory
    empty, and sizes them a moment later: a scrape in between read the empty file,
    failed, and answered 500 (seen under gunicorn when a killed worker was replaced).
    The file is skipped instead; what the other workers counted is still exposed."""
    shared = tmp_path / "prometheus"
    shared.mkdir()
    (shared / "counter_999999.db").touch()  # a booting worker's, not sized yet
    (shared / "gauge_livemax_999999.db").touch()
    code = SCRAPE.format(instance=str(tmp_path))
    result = run_python(code, PROMETHEUS_MULTIPROC_DIR=str(shared))
    assert result.returncode == 0, result.stderr
    status, _, body = result.stdout.partition("\n")
    assert status == "200", result.stdout + result.stderr
    assert "flask_quota_breaker_open" in body


def test_each_tier_counts_once_per_request(app: Flask, clock: FrozenClock) -> None:
    """An admitted request counts `allowed` once per tier; a denied one counts `denied`
    on the denying tier only. Labels are the tier, the policy name and the plan."""
    metered_app(app, MemoryStorage(clock))
    client = app.test_client()
    headers = {"X-Client": "alice"}
    statuses = [client.post("/infer", headers=headers).status_code for _ in range(3)]
    assert statuses == [200, 200, 429]
    assert client.get("/items", headers=headers).status_code == 200

    seen = scrape(client)
    plan = {"plan": "free"}
    assert seen.decisions(tier="global", resource="global", outcome="allowed", **plan) == 3
    assert seen.decisions(tier="user", resource="user", outcome="allowed", **plan) == 3
    assert seen.decisions(tier="endpoint", resource="ai_inference", outcome="allowed") == 2
    assert seen.decisions(tier="endpoint", resource="ai_inference", outcome="denied") == 1
    assert seen.decisions(outcome="denied") == 1  # global and user did not deny
    assert seen.value("flask_quota_storage_seconds_count") == 4  # one call per request
    assert seen.value("flask_quota_breaker_open") == 0
    assert "alice" not in seen.label_values() and "127.0.0.1" not in seen.label_values()


def test_the_metrics_route_is_exempt_and_never_counted(app: Flask, clock: FrozenClock) -> None:
    """Scrapes carry no rate-limit headers, are never refused, and count no decision."""
    metered_app(app, MemoryStorage(clock), QUOTA_PLANS={"free": {"global": "2/minute"}})
    client = app.test_client()
    responses = [client.get("/metrics") for _ in range(5)]
    assert [r.status_code for r in responses] == [200] * 5
    assert not any(h in r.headers for r in responses for h in RATE_HEADERS)
    assert scrape(client).decisions() == 0
    assert client.get("/items").status_code == 200
    assert scrape(client).decisions(outcome="allowed") == 1


def test_a_blocked_request_counts_once_as_blocked(app: Flask, clock: FrozenClock) -> None:
    """A blocked caller's request is one `blocked` decision, whatever its tiers said."""
    quota = metered_app(app, MemoryStorage(clock))
    with app.app_context():
        quota.block("mallory", seconds=60)
    client = app.test_client()
    assert client.post("/infer", headers={"X-Client": "mallory"}).status_code == 429
    seen = scrape(client)
    assert seen.decisions(tier="blocked", resource="blocked", plan="free", outcome="blocked") == 1
    assert seen.decisions() == 1
    assert "mallory" not in seen.label_values()


@pytest.mark.redis
def test_denials_answered_by_the_deny_cache_count_as_denials(
    app: Flask, redis_server: RedisServer
) -> None:
    """On Redis, the first denial asks Redis and later ones come from the deny cache:
    every one counts as `denied`, and each cache answer as a deny cache hit."""
    redis_server.client().flushall()
    metered_app(app, QUOTA_STORAGE_URL=redis_server.url)
    client = app.test_client()
    statuses = [client.post("/infer", headers={"X-Client": "bob"}).status_code for _ in range(6)]
    assert statuses == [200, 200, 429, 429, 429, 429]
    seen = scrape(client)
    assert seen.decisions(tier="endpoint", resource="ai_inference", outcome="allowed") == 2
    assert seen.decisions(tier="endpoint", resource="ai_inference", outcome="denied") == 4
    assert seen.value("flask_quota_deny_cache_hits_total") == 3  # all but the first denial
    assert seen.value("flask_quota_storage_seconds_count") == 6


def dead_redis_app(app: Flask, server: RedisServer, mode: str) -> FlaskClient:
    metered_app(
        app,
        QUOTA_STORAGE_URL=server.url,
        QUOTA_STORAGE_TIMEOUT=0.2,
        QUOTA_FAIL_MODE=mode,
        QUOTA_BREAKER_THRESHOLD=1,
        QUOTA_BREAKER_COOLDOWN=0.2,
    )
    return app.test_client()


@pytest.mark.redis
@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "status", "outcome"),
    [("open", 200, "fail_open"), ("closed", 503, "fail_closed"), ("local", 200, "local")],
)
def test_fail_modes_are_counted_and_the_breaker_gauge_follows_the_breaker(
    app: Flask, own_redis: RedisServer, mode: str, status: int, outcome: str
) -> None:
    """With Redis dead every request counts its fail mode's outcome on each tier and the
    breaker gauge is 1; once Redis is back and a probe succeeds, it is 0 again."""
    client = dead_redis_app(app, own_redis, mode)
    assert client.get("/items").status_code == 200
    own_redis.kill()
    statuses = [client.post("/infer", headers={"X-Client": "carol"}).status_code for _ in range(2)]
    assert statuses == [status, status]
    seen = scrape(client)
    assert seen.value("flask_quota_breaker_open") == 1
    for tier, resource in [("global", "global"), ("user", "user"), ("endpoint", "ai_inference")]:
        assert seen.decisions(tier=tier, resource=resource, outcome=outcome) == 2
    assert seen.decisions(outcome="allowed") == 2  # /items, before the outage

    own_redis.start()
    deadline = time.monotonic() + 10
    while scrape(client).value("flask_quota_breaker_open") != 0:
        assert time.monotonic() < deadline, "the breaker gauge stayed at 1 after recovery"
        client.get("/items")
        time.sleep(0.1)
