"""The benchmarked apps: one view, three equivalent limits in each library.

Every app serves ``GET /res`` returning ``"ok"``. A caller is identified by the
``X-User`` header (the user and endpoint tiers) and by ``REMOTE_ADDR`` (the
global tier), the same way in both libraries:

========  =====================================  ============================================
tier      flask-quota                            Flask-Limiter 4.1
========  =====================================  ============================================
global    plan ``global`` rate, keyed by IP      ``Limit(shared, scope="global")`` by IP
user      plan ``user`` rate, keyed by identity  ``Limit(shared, scope="user")`` by X-User
endpoint  ``@quota.limit(resource="res")``       ``@limiter.limit(per_method=True)`` by X-User
========  =====================================  ============================================

``tiers=1`` keeps only the endpoint tier, ``tiers=2`` adds the user tier,
``tiers=3`` all three. Every rate is ``rate``, by default ``1000000/hour`` (never
reached by a run);
``deny=True`` makes the endpoint tier ``1/hour``, so after one warm-up request
every request is denied by the endpoint tier while the other tiers allow.
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response, request

ALLOW = "1000000/hour"
DENY = "1/hour"
PATH = "/res"
RESOURCE = "res"
USER_HEADER = "X-User"

QUOTA_ALGORITHMS = ("token_bucket", "fixed_window", "sliding_window_log", "sliding_window_counter")
# Flask-Limiter's strategy closest to each of our algorithms. It has no token
# bucket; its default strategy (fixed-window) stands in for it.
LIMITER_STRATEGY = {
    "token_bucket": "fixed-window",
    "fixed_window": "fixed-window",
    "sliding_window_log": "moving-window",
    "sliding_window_counter": "sliding-window-counter",
}

_ids = itertools.count()


def _prefix(name: str) -> str:
    """A fresh key prefix per app, so apps sharing one redis-server never share state."""
    return f"{name}{next(_ids)}p{os.getpid()}"


def bare_app() -> Flask:
    app = Flask("bench_bare")

    @app.get(PATH)
    def res() -> str:
        return "ok"

    return app


def quota_app(
    storage_url: str,
    algorithm: str = "token_bucket",
    tiers: int = 3,
    *,
    deny: bool = False,
    headers: str = "both",
    rate: str = ALLOW,
    deny_cache: bool | None = None,
    prefetch: float | None = None,
    plan_extra: Mapping[str, Any] | None = None,
    tenant: bool = False,
    concurrent: int | None = None,
    more: Callable[[Flask, Any], None] | None = None,
    database_url: str = "sqlite://",
    config: Mapping[str, Any] | None = None,
) -> Flask:
    """flask-quota's app (see the module doc). ``plan_extra`` is merged into the plan
    (``{"tenant": rate}``; a ``"resources"`` entry replaces the plan's); ``tenant``
    gives each caller a tenant, one of ten, by the last digit of its ``X-User``;
    ``concurrent`` is the view's ``@quota.limit(concurrent=...)``; ``more(app, quota)``
    adds other views, never requested by the benchmark; ``database_url`` the quota
    tables' (a file for a ledger, which its writer thread reaches on a connection of its
    own); ``config`` more ``QUOTA_*`` settings."""
    from flask_quota import Identity, Quota
    from flask_quota.core.algorithms import MAX_LOG_LIMIT

    if algorithm == "sliding_window_log" and rate == ALLOW:
        # A log holds one entry per unit, so its limits are capped (MAX_LOG_LIMIT per
        # window): the largest log over a short window stands in for "never denies".
        rate = f"{MAX_LOG_LIMIT}/second"
    plan: dict[str, Any] = {"resources": {RESOURCE: DENY if deny else rate}}
    if tiers >= 2:
        plan["user"] = rate
    if tiers >= 3:
        plan["global"] = rate
    plan.update(plan_extra or {})
    app = Flask("bench_quota")
    prefix = _prefix("q")
    app.config["BENCH_KEYS"] = f"{prefix}:*"  # every storage key of this app
    app.config.update(
        QUOTA_STORAGE_URL=storage_url,
        QUOTA_ALGORITHM=algorithm,
        QUOTA_PLANS={"b": plan},
        QUOTA_DEFAULT_PLAN="b",
        QUOTA_ANONYMOUS_PLAN="b",
        QUOTA_HEADERS=headers,
        QUOTA_KEY_PREFIX=prefix,
        # A failed storage call must show up as an error, never as a fast
        # fail-open pass; Flask-Limiter's client has no timeout, so ours is generous.
        QUOTA_FAIL_MODE="closed",
        QUOTA_STORAGE_TIMEOUT=5.0,
        # Plans are served from SQL: give each app its own in-memory database (apps
        # must not share plans through a SQLite file), polled at the slowest allowed
        # interval because one benchmark process holds dozens of apps.
        QUOTA_DATABASE_URL=database_url,
        QUOTA_SYNC_INTERVAL=1.5,
    )
    app.config.update(config or {})
    if deny_cache is not None:  # default on: repeated denials are answered in-process
        app.config["QUOTA_DENY_CACHE"] = deny_cache
    app.config["QUOTA_PREFETCH"] = prefetch
    quota = Quota(app)

    @quota.identity_loader
    def identity() -> Identity | None:
        user = request.headers.get(USER_HEADER)
        return Identity(user, "b") if user else None

    if tenant:  # a loader of its own: the other apps' requests stay as they were

        @quota.identity_loader
        def tenant_identity() -> Identity | None:
            user = request.headers.get(USER_HEADER)
            return Identity(user, "b", f"t{user[-1]}") if user else None

    @app.get(PATH)
    @quota.limit(resource=RESOURCE, concurrent=concurrent)
    def res() -> str:
        return "ok"

    if more is not None:
        more(app, quota)
    return app


def limiter_app(
    storage_uri: str,
    strategy: str = "fixed-window",
    tiers: int = 3,
    *,
    deny: bool = False,
    headers: bool = False,
    rate: str = ALLOW,
) -> Flask:
    from flask_limiter import Limit, Limiter

    def ip() -> str:
        return request.remote_addr or "127.0.0.1"  # flask_limiter.util.get_remote_address

    def user() -> str:
        return request.headers.get(USER_HEADER) or ip()

    defaults = []
    if tiers >= 3:
        defaults.append(Limit(rate, key_function=ip, shared=True, scope="global", cost=1))
    if tiers >= 2:
        defaults.append(Limit(rate, key_function=user, shared=True, scope="user", cost=1))
    app = Flask("bench_limiter")
    prefix = _prefix("fl")
    app.config["BENCH_KEYS"] = f"*LIMITER/{prefix}/*"  # limits adds "LIMITS:{...}"
    limiter = Limiter(
        ip,
        app=app,
        default_limits=defaults,  # type: ignore[arg-type]
        storage_uri=storage_uri,
        strategy=strategy,
        headers_enabled=headers,
        key_prefix=prefix,
    )

    @app.get(PATH)
    @limiter.limit(DENY if deny else rate, key_func=user, per_method=True, override_defaults=False)
    def res() -> str:
        return "ok"

    return app


def standard_headers() -> list[tuple[str, str]]:
    """The rate-limit headers flask-quota sends on an allowed ``GET /res`` of
    ``quota_app`` (SPEC section 4, ``QUOTA_HEADERS=both``): six, taken from one real
    response, so their names and lengths are ours."""
    response = quota_app("memory://").test_client().get(PATH, headers={USER_HEADER: "u1"})
    return [(k, v) for k, v in response.headers.items() if k not in _OWN_HEADERS]


_OWN_HEADERS = {"Content-Type", "Content-Length"}  # what the bare app sends too


def bound_app(
    headers: list[tuple[str, str]] | None = None,
    redis_url: str | None = None,
    *,
    script: bool = False,
) -> Flask:
    """The bare app plus what every limiter that speaks SPEC's headers and asks storage
    once per request must do, and nothing else (``bench.bounds``): ``headers`` added to
    every response by an after-request hook; with ``redis_url``, one Redis round trip
    before each request on a raw socket each process keeps open (no client library).
    That round trip is a ``PING`` (no script, no key), or with ``script`` the floor's
    ``EVALSHA`` (``compare.FLOOR_SCRIPT``: a ``GET`` and a ``SET PX`` on the caller's
    three keys, built from the request as flask-quota builds them), packed by hand."""
    app = bare_app()
    if redis_url is not None:
        url = urlsplit(redis_url)
        address = (url.hostname or "127.0.0.1", url.port or 6379)
        held: dict[int, socket.socket] = {}  # pid -> its socket: a forked worker opens its own
        command, answer = _floor_command(redis_url) if script else _ping, _REPLY[script]

        @app.before_request
        def round_trip() -> None:
            sock = held.get(os.getpid())
            if sock is None:
                sock = held[os.getpid()] = socket.create_connection(address)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(command())
            got = b""
            while len(got) < len(answer):
                chunk = sock.recv(64)
                if not chunk:
                    raise ConnectionError("redis-server closed the connection")
                got += chunk
            if got != answer:
                raise ConnectionError(f"redis-server answered {got!r}")

    if headers is not None:
        app.after_request(header_hook(headers))
    return app


_REPLY = {False: b"+PONG\r\n", True: b":1\r\n"}  # PING's answer, the floor script's


def _bulk(value: bytes) -> bytes:
    """One RESP bulk string."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


def _ping() -> bytes:
    return b"*1\r\n" + _bulk(b"PING")


def _floor_command(redis_url: str) -> Callable[[], bytes]:
    """A function packing, for the request being served, the floor's ``EVALSHA`` on its
    caller's three keys (``X-User`` and the address), in RESP."""
    import redis

    from .compare import FLOOR_ARGS, FLOOR_SCRIPT, floor_keys  # compare imports this module

    sha = redis.Redis.from_url(redis_url).script_load(FLOOR_SCRIPT).encode()
    head = b"*8\r\n" + _bulk(b"EVALSHA") + _bulk(sha) + _bulk(b"3")
    tail = b"".join(_bulk(str(arg).encode()) for arg in FLOOR_ARGS)

    def command() -> bytes:
        ip, user = request.remote_addr or "", request.headers.get(USER_HEADER, "")
        keys = [_bulk(key.encode()) for key in floor_keys("floor", ip, user)]
        return b"".join([head, *keys, tail])

    return command


def header_hook(headers: list[tuple[str, str]]) -> Callable[[Response], Response]:
    """An after-request hook adding ``headers`` to every response, as flask-quota's own
    after hook adds its headers: straight onto Werkzeug's pair list, which skips
    ``Headers.add``'s check of each value for line breaks."""

    def add(response: Response) -> Response:
        response.headers._list.extend(headers)  # type: ignore[attr-defined]
        return response

    return add


def gunicorn_app() -> Flask:
    """Factory for ``gunicorn 'bench.apps:gunicorn_app()'``, configured by BENCH_* variables."""
    kind = os.environ["BENCH_APP"]
    # BENCH_STORAGE_URL=memory:// keeps flask-quota's counters in each worker (no Redis).
    url = os.environ.get("BENCH_STORAGE_URL") or os.environ.get("BENCH_REDIS_URL", "memory://")
    if kind == "bare":
        return bare_app()
    if kind == "quota":
        prefetch = os.environ.get("BENCH_PREFETCH")
        return quota_app(
            url,
            os.environ.get("BENCH_ALGORITHM", "token_bucket"),
            prefetch=float(prefetch) if prefetch else None,
            headers=os.environ.get("BENCH_QUOTA_HEADERS", "both"),
        )
    if kind in ("headers", "ping", "ping-headers", "raw-floor-headers"):  # bench.bounds
        return bound_app(
            standard_headers() if kind != "ping" else None,
            url if kind != "headers" else None,
            script=kind == "raw-floor-headers",
        )
    if kind == "floor":
        from .compare import floor_server_app  # compare imports this module

        return floor_server_app(url)
    if kind == "limiter":
        return limiter_app(
            url,
            os.environ.get("BENCH_STRATEGY", "fixed-window"),
            headers=os.environ.get("BENCH_HEADERS") == "1",
        )
    raise ValueError(
        f"BENCH_APP={kind!r}: use bare, floor, quota, limiter, headers, ping, ping-headers "
        "or raw-floor-headers"
    )
