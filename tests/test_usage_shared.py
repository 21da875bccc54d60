"""Dashboard usage on shared backends: every process sees every process's counts.

Real servers, started once for this module: a six-node Redis Cluster (three
masters, three replicas) and a Sentinel group (master, replica, three
sentinels). The other process is a real one: a Python subprocess serving its
own app on the same storage URL.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.apps.usage import app_on
from tests.conftest import _need_redis
from tests.sentinel import SentinelGroup
from tests.servers import ROOT

pytestmark = [pytest.mark.redis, pytest.mark.slow]


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    _need_redis()
    group = SentinelGroup(tmp_path_factory.mktemp("sentinel"))
    yield group
    group.stop()


@pytest.mark.parametrize("backend", ["cluster", "sentinel"])
def test_usage_is_shared_between_processes(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A request served by another process shows in this process's usage, as does its own."""
    url = request.getfixturevalue(backend).url
    prefix = f"shared-{uuid.uuid4().hex[:8]}"
    app = app_on(url, tmp_path / "here", prefix)
    http = app.test_client()
    first = int(time.time() // 60)
    assert http.get("/items", environ_base={"REMOTE_ADDR": "192.0.2.1"}).status_code == 200
    usage = app.extensions["quota"].usage
    usage.flush()
    there = str(tmp_path / "there")
    other = [sys.executable, "-m", "tests.apps.usage", url, there, prefix, "192.0.2.2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(other, cwd=ROOT, env=env, check=True, timeout=120)
    minute = int(time.time() // 60)
    minutes = usage.sink.minutes(minute - first + 1, minute)  # however long the other took
    assert sum((m.identities for m in minutes), Counter()) == {"ip=192.0.2.1": 1, "ip=192.0.2.2": 1}
    assert sum((m.tiers for m in minutes), Counter()) == {("user", True): 2}
    assert usage.sink.plan_of(["ip=192.0.2.2"], minute) == {"ip=192.0.2.2": "free"}
