"""Concurrency limits under real gunicorn workers on a real redis-server.

One server (4 sync workers, ``QUOTA_LEASE_SECONDS=3``) serves ``create_app()`` below:
``/slow``, ``/stream`` and ``/boom`` share ``concurrent=2`` on the resource ``work``.
A slow view waits until the test opens its gate (a file), so "in flight" lasts
exactly as long as a test needs; ``/free`` (exempt) says how many slots the caller
has left. Each test is its own caller (``X-Client``), so the tests share the server.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from flask import Flask, Response, request

from flask_quota import Identity, Quota
from tests.servers import Gunicorn, RedisServer, wait_for_workers

# quiet: leases expire on the Redis server's clock, and the gunicorn workers need the CPU.
pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.quiet]

LEASE_SECONDS = 3
WORKERS = 4


def create_app() -> Flask:
    """The app gunicorn serves (``tests.test_leases_gunicorn:create_app()``)."""
    app = Flask(__name__)
    app.config.update({k: v for k, v in os.environ.items() if k.startswith("QUOTA_")})
    quota = Quota(app)
    gates = Path(os.environ["LEASE_GATES"])

    @quota.identity_loader
    def caller() -> Identity:
        return Identity(request.headers["X-Client"], "test")

    def wait_for_gate() -> None:
        """Note this worker as running the view, then wait until the test opens the gate."""
        gate = request.args["gate"]
        (gates / f"{gate}.{os.getpid()}.running").touch()
        deadline = time.monotonic() + 30
        while not (gates / gate).exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    @app.get("/slow")
    @quota.limit(resource="work", concurrent=2)
    def slow() -> str:
        wait_for_gate()
        return "done"

    @app.get("/stream")
    @quota.limit(resource="work", concurrent=2)
    def stream() -> Response:
        gate = request.args["gate"]

        def body() -> Iterator[str]:
            yield "started "
            deadline = time.monotonic() + 30
            while not (gates / gate).exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            yield "ended"

        return Response(body())

    @app.get("/boom")
    @quota.limit(resource="work", concurrent=2)
    def boom() -> str:
        raise RuntimeError("the view failed")

    @app.get("/free")
    @quota.exempt
    def free() -> Response:
        found = {b.name: b.remaining for b in quota.peek(request.headers["X-Client"])}
        return Response(json.dumps(found["concurrent (work)"]))

    @app.get("/healthz")
    @quota.exempt
    def healthz() -> Response:
        return Response(json.dumps({"worker": os.getpid()}))

    return app


@pytest.fixture(scope="module")
def server(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Gunicorn, Path]]:
    gates = tmp_path_factory.mktemp("gates")
    env = {
        "QUOTA_STORAGE_URL": redis_server.url,
        "QUOTA_KEY_PREFIX": f"leases{time.monotonic_ns()}",
        "QUOTA_PLANS": json.dumps({"test": {"user": "1000/minute"}}),
        "QUOTA_DEFAULT_PLAN": "test",
        "QUOTA_ANONYMOUS_PLAN": "test",
        "QUOTA_FAIL_MODE": "closed",  # a slow storage call must never admit unleased
        "QUOTA_STORAGE_TIMEOUT": "2",
        "QUOTA_LEASE_SECONDS": str(LEASE_SECONDS),
        "LEASE_GATES": str(gates),
        "GUNICORN_LOG": str(gates / "gunicorn.log"),
    }
    gunicorn = Gunicorn(env, workers=WORKERS, app="tests.test_leases_gunicorn:create_app()")
    try:
        wait_for_workers(gunicorn.port, WORKERS)
        yield gunicorn, gates
    finally:
        gunicorn.stop()


def get(port: int, path: str, client: str, timeout: float = 30.0) -> tuple[int, bytes]:
    """One GET as ``client`` over a fresh loopback connection: (status, body)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"X-Client": client})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def free(port: int, client: str) -> int:
    """The caller's free slots on ``work``, as the storage says now."""
    return int(get(port, "/free", client)[1])


def running(gates: Path, gate: str) -> list[int]:
    """The workers (pids) running a view behind ``gate``."""
    return [int(p.name.split(".")[1]) for p in gates.glob(f"{gate}.*.running")]


def poll(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``condition()`` until true; the seconds it took."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"{what} within {timeout} s"
        time.sleep(0.02)
    return time.monotonic() - start


def test_two_of_six_run_and_four_are_refused(server: tuple[Gunicorn, Path]) -> None:
    """``concurrent=2`` over 4 workers: of 6 simultaneous slow requests exactly 2 run and
    4 get 429; when they end both slots are free again."""
    gunicorn, gates = server
    port, who = gunicorn.port, "six"
    with ThreadPoolExecutor(6) as pool:
        futures = [pool.submit(get, port, "/slow?gate=six", who) for _ in range(6)]
        poll(lambda: sum(f.done() for f in futures) == 4, 20, "four answered while two run")
        early = Counter(f.result()[0] for f in futures if f.done())
        assert early == {429: 4}
        # Both admitted requests hold their slots from the decision on; their views may
        # start a moment after the refusals are back, and note themselves running then.
        poll(lambda: len(running(gates, "six")) >= 2, 5, "both admitted requests running")
        assert len(running(gates, "six")) == 2
        assert free(port, who) == 0
        (gates / "six").touch()
        final = Counter(f.result()[0] for f in futures)
    assert final == {200: 2, 429: 4}
    assert free(port, who) == 2


def test_a_stream_holds_its_slot_until_it_ends(server: tuple[Gunicorn, Path]) -> None:
    """A streamed response holds its lease while it streams and frees it when it ends."""
    gunicorn, gates = server
    port, who = gunicorn.port, "stream"
    with ThreadPoolExecutor(1) as pool:
        streaming: Future[tuple[int, bytes]] = pool.submit(get, port, "/stream?gate=st", who)
        poll(lambda: free(port, who) == 1, 20, "the stream took a slot")
        assert not streaming.done()
        (gates / "st").touch()
        assert streaming.result() == (200, b"started ended")
    poll(lambda: free(port, who) == 2, 5, "the slot came back when the stream ended")


def test_a_view_that_raises_gives_its_slot_back(server: tuple[Gunicorn, Path]) -> None:
    """Failed views (500) give their leases back: more of them than slots, then 2 free."""
    gunicorn, _ = server
    port, who = gunicorn.port, "boom"
    assert [get(port, "/boom", who)[0] for _ in range(4)] == [500] * 4
    assert free(port, who) == 2


def test_a_killed_workers_slots_expire(server: tuple[Gunicorn, Path]) -> None:
    """Two workers killed (SIGKILL) while holding leases: the slots stay taken, then come
    back ``QUOTA_LEASE_SECONDS`` after admission, within 6 s of the kill."""
    gunicorn, gates = server
    port, who = gunicorn.port, "killed"
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(get, port, "/slow?gate=kill", who) for _ in range(2)]
        poll(lambda: len(running(gates, "kill")) == 2, 20, "both slow views started")
        admitted = time.monotonic()
        assert free(port, who) == 0
        for pid in running(gates, "kill"):
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        for f in futures:
            with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
                f.result()
    assert free(port, who) == 0  # nobody gave them back
    poll(lambda: free(port, who) == 2, 6, "the slots came back within 6 s of the kill")
    assert time.monotonic() - admitted >= LEASE_SECONDS - 0.5  # expired, not given back
    assert killed - admitted < LEASE_SECONDS  # the kill came while they were held
    (gates / "kill").touch()
