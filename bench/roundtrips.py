"""Measurement 1: Redis round trips per request, counted at the client."""

from __future__ import annotations

from dataclasses import dataclass

from flask import Flask

from .apps import LIMITER_STRATEGY, QUOTA_ALGORITHMS, limiter_app, quota_app
from .driver import WsgiDriver, caller_sequence, count_round_trips, repeat


@dataclass(frozen=True)
class RoundTripRow:
    library: str  # "flask-quota" or "Flask-Limiter"
    algorithm: str  # our algorithm or their strategy
    headers: str  # which rate-limit headers the app sends
    tiers: int
    outcome: str  # "allowed" or "denied"
    sends: float  # round trips per request
    replies: float  # replies (commands) per request


def _count(app: Flask, deny: bool, requests: int) -> tuple[float, float]:
    # Two callers that alternate; warm-up loads the scripts, opens the
    # connection and, for "denied", spends the endpoint tier's single unit.
    driver = WsgiDriver(app, caller_sequence(2, 2))
    repeat(driver, 4)
    driver.statuses.clear()
    with count_round_trips() as counts:
        repeat(driver, requests)
    driver.expect("429" if deny else "200")
    return counts.sends / requests, counts.replies / requests


def measure(redis_url: str, requests: int = 20) -> list[RoundTripRow]:
    rows = []
    for algorithm in QUOTA_ALGORITHMS:
        for tiers in (1, 2, 3):
            for deny, cache, outcome in (
                (False, None, "allowed"),
                (True, None, "denied"),  # QUOTA_DENY_CACHE on (the default)
                (True, False, "denied, no deny cache"),
            ):
                app = quota_app(redis_url, algorithm, tiers, deny=deny, deny_cache=cache)
                sends, replies = _count(app, deny, requests)
                rows.append(
                    RoundTripRow("flask-quota", algorithm, "both", tiers, outcome, sends, replies)
                )
    for strategy in dict.fromkeys(LIMITER_STRATEGY.values()):
        for headers in (False, True):
            for tiers in (1, 2, 3):
                for deny in (False, True):
                    app = limiter_app(redis_url, strategy, tiers, deny=deny, headers=headers)
                    sends, replies = _count(app, deny, requests)
                    rows.append(
                        RoundTripRow(
                            "Flask-Limiter",
                            strategy,
                            "X-RateLimit" if headers else "none (default)",
                            tiers,
                            "denied" if deny else "allowed",
                            sends,
                            replies,
                        )
                    )
    return rows
