"""The demo (`gunicorn wsgi:app`) starts while its database is down, says so, and
serves the built-in plans."""

from __future__ import annotations

import http.client
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import Gunicorn, free_port
from tests.sqlfaults import HungDatabase, hung_url

pytestmark = pytest.mark.slow


@pytest.fixture
def hung() -> Iterator[HungDatabase]:
    server = HungDatabase()
    yield server
    server.close()


def request(port: int, method: str, path: str) -> tuple[int, float]:
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    finally:
        conn.close()


@pytest.mark.parametrize("down", ["refused", "hung"])
def test_the_demo_starts_with_its_database_down_and_says_so(
    tmp_path: Path, hung: HungDatabase, down: str
) -> None:
    """With QUOTA_DATABASE_URL unreachable (nothing listening, or a server that never
    answers) the demo boots, logs one clear line, and limits with the built-in plans."""
    url = hung.url if down == "hung" else hung_url(free_port())
    log = tmp_path / "gunicorn.log"
    server = Gunicorn(
        {
            "QUOTA_DATABASE_URL": url,
            "SECRET_KEY": "demo-test",  # the dashboard stays mounted, as in the demo
            "DEMO_DASHBOARD_PASSWORD": "demo-test",
            "GUNICORN_LOG": str(log),
        },
        workers=1,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if request(server.port, "GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        answers = [request(server.port, "POST", "/v1/ai/infer") for _ in range(7)]
        assert [status for status, _ in answers] == [200] * 5 + [429] * 2, log.read_text()
        assert max(seconds for _, seconds in answers) < 10
        deadline = time.monotonic() + 30
        while "flask-quota demo: the quota database" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        text = log.read_text()
        line = next(x for x in text.splitlines() if "flask-quota demo: the quota database" in x)
        assert "built-in plans" in line and "127.0.0.1" in line, line
        assert "Traceback" not in text, text
    finally:
        server.stop()
