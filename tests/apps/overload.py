"""An app for overload protection under real gunicorn workers: ``/slow`` counts the
requests running in it at once (in Redis, so every worker's count together) and
keeps the highest; ``/hold?gate=G`` notes its worker and waits until the test opens
the gate (a file). Served as ``gunicorn tests.apps.overload:app``; every ``QUOTA_*``
setting comes from the environment (``QUOTA_RESERVE`` as JSON)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import redis
from flask import Flask, request

from flask_quota import Quota

# INCR the running count and keep its highest value, in one step.
_ENTER = """
local running = redis.call('INCR', KEYS[1])
if running > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], running)
end
return running
"""

app = Flask(__name__)
app.config.update({k: v for k, v in os.environ.items() if k.startswith("QUOTA_")})
quota = Quota(app)
counter = redis.Redis.from_url(os.environ["COUNT_URL"])
enter = counter.register_script(_ENTER)
gates = Path(os.environ["GATES"])


@app.get("/slow")
def slow() -> str:
    enter(keys=["running", "most"])
    try:
        time.sleep(0.2)
    finally:
        counter.decr("running")
    return "done"


@app.get("/hold")
def hold() -> str:
    gate = request.args["gate"]
    (gates / f"{gate}.{os.getpid()}.{threading.get_ident()}.running").touch()
    deadline = time.monotonic() + 60
    while not (gates / gate).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return "done"


@app.get("/healthz")
@quota.exempt
def healthz() -> str:
    return "ok"
