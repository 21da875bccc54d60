"""The fleet capacity's scenario (``QUOTA_CAPACITY``), one function every storage runs:
memory, Redis and Valkey (tests/test_overload.py), Sentinel and Cluster (their modules)."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Flask, Response, request

from flask_quota import Identity, Quota
from flask_quota.storage import Storage

__all__ = ["capacity_scenario"]

WEEK = "7 days"  # nothing refills while the scenario runs


def capacity_scenario(app: Flask, storage: Storage | None = None, **config: Any) -> None:
    """Capacity 3 (no reserves): three held responses fill it and a fourth request is
    shed (503, ``"tier": "capacity"``) charging its caller nothing; a caller its own
    limit refuses leaves no slot taken (on a Cluster its slot was taken in another
    hash slot, then refunded); a closed response gives its slot back, exactly one."""
    app.config.update(
        QUOTA_DATABASE_URL=f"sqlite:///{app.instance_path}/quota.sqlite3",
        QUOTA_PLANS={"free": {"user": f"100/{WEEK}"}, "tiny": {"user": f"1/{WEEK}"}},
        QUOTA_CAPACITY=3,
        QUOTA_RESERVE={},
        QUOTA_DENY_CACHE=False,
        QUOTA_FAIL_MODE="closed",  # a failing storage must show, never pass
        QUOTA_KEY_PREFIX=f"cap{uuid.uuid4().hex[:8]}",  # a shared server's other keys
        **config,
    )
    quota = Quota(app, storage=storage)

    @quota.identity_loader
    def who() -> Identity:
        return Identity(request.headers["X-Who"], request.headers.get("X-Plan", "free"))

    app.add_url_rule("/hold", "hold", lambda: Response(iter(["held"])))
    app.add_url_rule("/ping", "ping", lambda: "pong")
    client = app.test_client()

    def ping(who: str, plan: str = "free") -> tuple[int, str | None]:
        with client.get("/ping", headers={"X-Who": who, "X-Plan": plan}) as response:
            body = response.get_json(silent=True) or {}
            return response.status_code, body.get("tier")

    def user_left(who: str) -> int:
        with app.app_context():
            return next(b.remaining for b in quota.peek(identity=who) if b.name == "user")

    held = [client.get("/hold", headers={"X-Who": f"h{i}"}) for i in range(3)]
    assert [r.status_code for r in held] == [200, 200, 200]
    assert ping("bob") == (503, "capacity")
    assert user_left("bob") == 100  # a shed request charges no budget
    held.pop().close()  # one slot free
    assert ping("carl", "tiny") == (200, None)
    assert ping("carl", "tiny") == (429, "user")  # his own limit: no slot kept
    held.append(client.get("/hold", headers={"X-Who": "h3"}))
    assert held[-1].status_code == 200  # the one free slot
    assert ping("bob") == (503, "capacity")  # and no more
    for response in held:
        response.close()
    assert ping("bob") == (200, None)
    assert user_left("bob") == 99
    again = [client.get("/hold", headers={"X-Who": f"g{i}"}) for i in range(4)]
    assert [r.status_code for r in again] == [200, 200, 200, 503]  # all three came back
    for response in again:
        response.close()
