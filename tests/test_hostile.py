"""Hostile input never yields a 500 and never buys a fresh bucket."""

from __future__ import annotations

import secrets
import socket
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flask_quota import Identity, Quota
from flask_quota.core.identity import client_ip
from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock
from tests.servers import Gunicorn

KNOWN_KEY = "known_key_0123456789"


def limited_app(app: Flask, clock: FrozenClock, **config: Any) -> FlaskClient:
    app.config.update({"QUOTA_PLANS": {"free": {"user": "5/hour"}}, **config})
    quota = app.config["TEST_QUOTA"] = Quota(app, storage=MemoryStorage(clock))

    @quota.api_key_loader
    def lookup(key: str) -> Identity | None:
        return Identity("client-1", "free") if secrets.compare_digest(key, KNOWN_KEY) else None

    @app.get("/items")
    def items() -> str:
        return "ok"

    return app.test_client()


def remaining(response: Any) -> int:
    return int(response.headers["X-RateLimit-Remaining"])


HOSTILE_VALUES = [
    "A" * 100_000,  # 100 kB
    "abc\r\nX-Injected: 1",
    "\x00\x01\x02binary\xff\xfe",
    "ключ-🔑-キー-" * 3,
    "{victim}" * 4,
    "' OR 1=1 --",
    "",
    " ",
]


@pytest.mark.parametrize("value", HOSTILE_VALUES)
def test_hostile_api_keys_share_the_anonymous_budget(
    app: Flask, clock: FrozenClock, value: str
) -> None:
    """Huge, CRLF, binary and unicode keys are anonymous: same budget as no key."""
    http = limited_app(app, clock)
    assert remaining(http.get("/items")) == 4
    response = http.get("/items", environ_base={"HTTP_X_API_KEY": value})
    assert response.status_code == 200
    assert remaining(response) == 3  # charged to the IP's bucket, not a new one


def test_a_thousand_random_keys_share_one_budget(app: Flask, clock: FrozenClock) -> None:
    """Inventing API keys cannot mint buckets: 1,000 random keys get 5 requests in all."""
    http = limited_app(app, clock)
    statuses = [
        http.get("/items", headers={"X-API-Key": secrets.token_urlsafe(24)}).status_code
        for _ in range(1000)
    ]
    assert statuses.count(200) == 5
    assert statuses.count(429) == 995
    assert len(app.extensions["quota"].storage) == 1  # one bucket, the IP's


def test_known_key_gets_its_own_budget(app: Flask, clock: FrozenClock) -> None:
    """A valid key is an identity with a budget separate from the anonymous one."""
    http = limited_app(app, clock)
    for _ in range(5):
        http.get("/items")
    assert http.get("/items").status_code == 429
    assert http.get("/items", headers={"X-API-Key": KNOWN_KEY}).status_code == 200


def test_unknown_keys_can_be_rejected_with_401(app: Flask, clock: FrozenClock) -> None:
    """QUOTA_REJECT_UNKNOWN_KEYS answers 401 problem+json and charges nothing."""
    http = limited_app(app, clock, QUOTA_REJECT_UNKNOWN_KEYS=True)
    for value in ["nope-nope-nope", "A" * 100_000, "\r\n", "é"]:
        response = http.get("/items", environ_base={"HTTP_X_API_KEY": value})
        assert response.status_code == 401
        assert response.content_type == "application/problem+json"
        assert response.get_json()["status"] == 401
        assert "WWW-Authenticate" in response.headers
    assert remaining(http.get("/items")) == 4  # nothing was charged
    assert http.get("/items", headers={"X-API-Key": KNOWN_KEY}).status_code == 200


def test_spoofed_forwarded_for_does_not_change_the_key(app: Flask, clock: FrozenClock) -> None:
    """Without a trusted proxy, X-Forwarded-For is ignored: rotating it buys nothing."""
    http = limited_app(app, clock)
    statuses = [
        http.get("/items", headers={"X-Forwarded-For": f"203.0.113.{i}"}).status_code
        for i in range(10)
    ]
    assert statuses == [200] * 5 + [429] * 5


def test_ipv6_addresses_are_grouped_by_64(app: Flask, clock: FrozenClock) -> None:
    """Addresses in one /64 share a budget; another /64 has its own."""
    http = limited_app(app, clock)
    for i in range(5):
        http.get("/items", environ_base={"REMOTE_ADDR": f"2001:db8:1:2::{i + 1:x}"})
    same = http.get("/items", environ_base={"REMOTE_ADDR": "2001:db8:1:2:ffff::9"})
    other = http.get("/items", environ_base={"REMOTE_ADDR": "2001:db8:1:3::1"})
    assert (same.status_code, other.status_code) == (429, 200)


@pytest.mark.parametrize(
    ("remote", "expected"),
    [
        ("192.0.2.7", "192.0.2.7"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("2001:db8::1", "2001:db8::/64"),
        ("fe80::1%eth0", "fe80::/64"),
        (None, "unknown"),
        ("not an ip", "unknown"),
        ("1.2.3.4\r\n", "unknown"),
    ],
)
def test_client_ip_normalisation(remote: str | None, expected: str) -> None:
    """remote_addr is parsed strictly; anything unparsable is one 'unknown' bucket."""
    assert client_ip(remote) == expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    key=st.text(alphabet=st.characters(max_codepoint=0x2FFFF, blacklist_categories=["Cs"])),
    forwarded=st.text(max_size=50),
    user=st.text(max_size=60),
)
def test_fuzzed_headers_never_raise(
    tmp_path_factory: Any, key: str, forwarded: str, user: str
) -> None:
    """Random API keys, X-Forwarded-For values and identities never cause a 500."""
    app = Flask(__name__, instance_path=str(tmp_path_factory.mktemp("fuzz")))
    http = limited_app(app, FrozenClock())
    quota: Quota = app.config["TEST_QUOTA"]
    quota.identity_loader(lambda: Identity(user) if user else None)
    environ = {"HTTP_X_API_KEY": key.encode("utf-8", "replace").decode("latin-1")}
    environ["HTTP_X_FORWARDED_FOR"] = forwarded.encode("utf-8", "replace").decode("latin-1")
    response = http.get("/items", environ_base=environ)
    assert response.status_code == 200


def test_real_server_rejects_oversized_headers_without_500(tmp_path: Any) -> None:
    """Through gunicorn, a 100 kB header, CRLF tricks and binary bytes never give a 5xx."""
    server = Gunicorn({"QUOTA_PLANS": '{"free": {"user": "100/hour"}}'}, workers=1)
    try:
        payloads = [
            b"X-API-Key: " + b"A" * 100_000,
            b"X-API-Key: abc\r\nX-Forwarded-For: 1.2.3.4",
            b"X-API-Key: \x00\x01\xff\xfe binary",
            "X-API-Key: клю\u0447".encode(),
            b"X-Forwarded-For: " + b"9.9.9.9, " * 500,
        ]
        for payload in payloads:
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.sendall(b"GET /v1/items HTTP/1.1\r\nHost: x\r\n" + payload + b"\r\n\r\n")
                status_line = sock.recv(64).split(b"\r\n", 1)[0]
            code = int(status_line.split()[1])
            assert code < 500 and code in (200, 400, 431), (payload[:40], status_line)
    finally:
        server.stop()
