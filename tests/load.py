"""HTTP load for tests: many concurrent clients against a real server, every reply recorded."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.servers import Gunicorn

__all__ = ["Flood", "Reply", "get", "hammer", "serve_many"]

RATE_HEADERS = ("X-RateLimit-Limit", "RateLimit")


@dataclass(frozen=True)
class Reply:
    """One response (status 0: no response at all), when it was sent and how long it took."""

    status: int
    headers: dict[str, str]
    sent: float  # time.monotonic() when the request left
    elapsed: float
    tag: str = ""  # what the caller asked for, e.g. the identity

    @property
    def limited(self) -> bool:
        """Redis decided this request (rate-limit headers present): limits apply."""
        return any(name in self.headers for name in RATE_HEADERS)


def get(
    port: int,
    path: str,
    headers: dict[str, str] | None = None,
    *,
    tag: str = "",
    timeout: float = 10,
) -> Reply:
    sent = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        response.read()
        return Reply(
            response.status, dict(response.getheaders()), sent, time.monotonic() - sent, tag
        )
    except OSError:
        return Reply(0, {}, sent, time.monotonic() - sent, tag)
    finally:
        conn.close()


def hammer(
    port: int, requests: Iterable[tuple[str, dict[str, str], str]], *, clients: int = 32
) -> list[Reply]:
    """Send every ``(path, headers, tag)`` using ``clients`` concurrent connections."""
    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(lambda r: get(port, r[0], r[1], tag=r[2]), requests))


def serve_many(
    tmp_path: Path, plans: dict[str, Any], *, workers: int = 4, threads: int = 1, **env: str
) -> Gunicorn:
    """Gunicorn serving ``tests.apps.many`` with ``plans`` (the first is the default plan),
    its own SQLite file and log in ``tmp_path``; returns once every worker answers.
    ``threads`` > 1 runs gunicorn's threaded workers (``gthread``)."""
    first = next(iter(plans))
    tmp_path.mkdir(parents=True, exist_ok=True)
    server = Gunicorn(
        {
            "QUOTA_PLANS": json.dumps(plans),
            "QUOTA_DEFAULT_PLAN": first,
            "QUOTA_ANONYMOUS_PLAN": first,
            "QUOTA_DATABASE_URL": f"sqlite:///{tmp_path}/quota.sqlite3",
            "GUNICORN_LOG": str(tmp_path / "gunicorn.log"),
            **env,
        },
        workers=workers,
        threads=threads,
        app="tests.apps.many:app",
    )
    deadline = time.monotonic() + 30
    # Every worker has imported the app once 4 x workers health checks in a row pass.
    streak = 0
    while streak < 4 * workers:
        streak = streak + 1 if get(server.port, "/healthz").status == 200 else 0
        if time.monotonic() > deadline:
            server.stop()
            raise TimeoutError(f"tests.apps.many not healthy; see {tmp_path / 'gunicorn.log'}")
        if not streak:
            time.sleep(0.1)
    return server


@dataclass
class Flood:
    """Background load: ``clients`` threads loop over ``requests`` until ``stop()``."""

    port: int
    requests: Sequence[tuple[str, dict[str, str]]]
    clients: int = 8
    pause: float = 0.0  # seconds each client waits between requests
    replies: list[Reply] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.clients)
        ]

    def __enter__(self) -> Flood:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> list[Reply]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        return self.replies

    def since(self, moment: float) -> list[Reply]:
        with self._lock:
            return [r for r in self.replies if r.sent >= moment]

    def _run(self, offset: int) -> None:
        i = offset
        while not self._stop.is_set():
            path, headers = self.requests[i % len(self.requests)]
            reply = get(self.port, path, headers, timeout=10)
            with self._lock:
                self.replies.append(reply)
            i += self.clients
            if self.pause:
                self._stop.wait(self.pause)
