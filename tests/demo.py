"""The demo (wsgi.py) in this process, its background work done before a test goes on;
and, in other processes, its ``flask quota`` commands and requests to it under gunicorn.

Importing ``wsgi`` builds its module-level app, and every app it builds outside a
``flask`` command starts a thread that makes the demo clients and prints their keys to
stderr. Left running, that print lands in whatever a later test on the same pytest-xdist
worker is capturing (a CLI runner's output, say), so each is joined here.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

from flask import Flask

from tests.servers import ROOT

DEMO_THREAD = "demo"  # wsgi.py's name for it


def demo_app(config: dict[str, Any] | None = None) -> Flask:
    """``wsgi.create_app(config)``, once every demo thread so far has finished."""
    import wsgi

    app = wsgi.create_app(config)
    for thread in threading.enumerate():
        if thread.name == DEMO_THREAD:
            thread.join(timeout=30)
    return app


def flask_quota(env: dict[str, str], *args: str) -> str:
    """`flask --app wsgi quota ...` in its own process, as an operator runs it."""
    result = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "wsgi", "quota", *args],
        cwd=ROOT,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("QUOTA_")}, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def probe(port: int, key: str) -> tuple[float, int, int] | None:
    """(start time, worker pid, user-tier quota) of one request on a fresh connection.

    ``None`` when the response has no quota headers: Redis was too slow and the
    request failed open (the box is shared), which says nothing about the plan.
    """
    started = time.time()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/", headers={"X-API-Key": key})
        response = conn.getresponse()
        body = json.loads(response.read())
        policy = response.getheader("RateLimit-Policy") or ""
        if '"user";q=' not in policy:
            return None
        quota = int(policy.split('"user";q=')[1].split(";")[0])
        return started, int(body["worker"]), quota
    finally:
        conn.close()
