"""Small helpers that several test modules share: routes to limit, what a bucket has left."""

from __future__ import annotations

from flask import Flask

from flask_quota import Quota

__all__ = ["infer_and_items", "left"]


def infer_and_items(app: Flask, quota: Quota) -> None:
    """``POST /infer`` meets the endpoint tier "ai_inference"; ``GET /items`` does not."""

    @app.post("/infer")
    @quota.limit(resource="ai_inference")
    def infer() -> str:
        return "inferred"

    @app.get("/items")
    def items() -> str:
        return "items"


def left(app: Flask, quota: Quota, resource: str = "tokens") -> int:
    """What the caller at 127.0.0.1 has left of ``resource`` on POST (peeked, not spent)."""
    with app.app_context():
        found = [b for b in quota.peek(ip="127.0.0.1") if b.name == f"{resource} (POST)"]
    return found[0].remaining
