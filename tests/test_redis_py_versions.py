"""The built wheel on the redis-py a team already has.

A team migrating from Flask-Limiter installs ``flask-limiter[redis]`` first (it
brings its own redis-py, below 8 today) and then us; another team sits on
redis-py 6. In a fresh venv holding that set-up and our wheel, a Redis-backed
3/minute route answers ``200 200 200 429``. (redis-py 5.0, the lowest we
declare, is the ``lowest`` nox session's; the newest is the main run's.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.builds import Dists, ok, run
from tests.servers import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.timeout(900)]

APP = """
import json, sys
import redis
from flask import Flask
from flask_quota import Quota

app = Flask(__name__)
app.config["QUOTA_STORAGE_URL"] = sys.argv[1]
app.config["QUOTA_DATABASE_URL"] = "sqlite://"
quota = Quota(app)

@app.get("/reports")
@quota.limit("3/minute")
def reports():
    return {"reports": []}

client = app.test_client()
statuses = [client.get("/reports").status_code for _ in range(4)]
print(json.dumps({"redis": redis.__version__, "statuses": statuses}))
"""


@pytest.mark.parametrize(
    "first",
    ["flask-limiter[redis]", "redis>=6,<7"],
    ids=["after-flask-limiter", "redis-py-6"],
)
def test_a_redis_backed_route_on_the_redis_py_already_installed(
    first: str, dists: Dists, redis_server: RedisServer, tmp_path: Path
) -> None:
    """``first`` installed, then the wheel: redis-py stays what ``first`` brought, and a
    3/minute route on real Redis answers 200 200 200 429 (not 500)."""
    import venv

    venv.EnvBuilder(with_pip=True).create(tmp_path / "venv")
    python = tmp_path / "venv" / "bin" / "python"
    pip = (python, "-m", "pip", "install", "-q", "--disable-pip-version-check")
    ok(run(*pip, first))
    before = ok(run(python, "-c", "import redis; print(redis.__version__)")).strip()
    ok(run(*pip, str(dists.wheel)))
    (tmp_path / "app.py").write_text(APP)
    redis_server.client().flushall()
    served = run(python, tmp_path / "app.py", redis_server.url, cwd=tmp_path)
    ok(served)
    result = json.loads(served.stdout.strip().splitlines()[-1])
    assert result["redis"] == before  # our wheel did not replace the team's redis-py
    assert int(before.split(".")[0]) < 8  # so this is not the main run's redis-py 8
    assert result["statuses"] == [200, 200, 200, 429]
