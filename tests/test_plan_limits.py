"""Per-limit algorithms and shadow mode, from the plan table to the response."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask

from flask_quota import Quota
from flask_quota.clock import US
from flask_quota.testing import FrozenClock, MemoryStorage

PLANS = {"free": {"user": "100/minute", "resources": {"ai_inference": "50/minute"}}}


@pytest.fixture
def sql_app(tmp_path: Path) -> Iterator[tuple[Flask, FrozenClock]]:
    """A SQLite-backed app with an ``ai_inference`` view, on a frozen clock."""
    clock = FrozenClock(1_700_000_000.0 + 17.25)  # mid-minute: a window's reset is not "now + 60"
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        TESTING=True,
        QUOTA_PLANS=PLANS,
        QUOTA_DATABASE_URL=f"sqlite:///{tmp_path / 'quota.sqlite3'}",
    )
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/ai")
    @quota.limit(resource="ai_inference")
    def ai() -> str:
        return "ok"

    yield app, clock
    app.extensions["quota"].sql.close()


def cli(app: Flask, *args: str) -> str:
    result = app.test_cli_runner().invoke(args=["quota", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_cli_algorithm_and_shadow_apply_to_requests(sql_app: tuple[Flask, FrozenClock]) -> None:
    """`plans set ... --algorithm fixed_window` and `... --shadow` (issue 10's must-show):
    5 x 200 then 429 with a reset on the minute boundary; the shadow user tier, which
    allows only 2, neither denies nor appears in the headers."""
    app, clock = sql_app
    cli(app, "plans", "set", "free", "endpoint", "5/minute", "--resource", "ai_inference",
        "--algorithm", "fixed_window")  # fmt: skip
    cli(app, "plans", "set", "free", "user", "2/minute", "--shadow")
    http = app.test_client()
    statuses = [http.get("/ai").status_code for _ in range(6)]
    assert statuses == [200] * 5 + [429]
    denied = http.get("/ai")
    reset = int(denied.headers["X-RateLimit-Reset"])
    assert reset % 60 == 0 and 0 < reset - clock.now_us / US <= 60
    assert denied.headers["X-RateLimit-Resource"] == "ai_inference"
    policy = denied.headers["RateLimit-Policy"]
    assert '"ai_inference";q=5;w=60' in policy and '"user"' not in policy
    listing = cli(app, "plans", "list")
    assert re.search(r"free\s+user\s+-\s+2/minute\s+\S+\s+shadow", listing)
    assert re.search(r"free\s+endpoint\s+ai_inference\s+5/minute\s+fixed_window\s+enforce", listing)
