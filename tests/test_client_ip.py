"""The address the global tier is keyed by: ``client_ip``'s dotted-quad fast path answers
exactly what parsing does, an address with a port is its address, and what cannot be
parsed is said once."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
from flask import Flask
from hypothesis import given
from hypothesis import strategies as st
from werkzeug.middleware.proxy_fix import ProxyFix

from flask_quota import Quota
from flask_quota.core import identity
from flask_quota.core.identity import client_ip, parsed_ip

PART = st.one_of(
    st.integers(0, 300).map(str),
    st.sampled_from(["00", "01", "007", "0255", "-1", "", "1e2", "٣", "1 "]),
)


@given(parts=st.lists(PART, min_size=3, max_size=5), sep=st.sampled_from([".", ":", ". "]))
def test_dotted_quads_and_near_misses(parts: list[str], sep: str) -> None:
    address = sep.join(parts)
    assert client_ip(address) == parsed_ip(address)


def test_fast_path_cases() -> None:
    for address in ["1.2.3.4", "255.255.255.255", "0.0.0.0", "10.0.0.1"]:
        assert client_ip(address) == address
    assert client_ip("01.2.3.4") == "unknown"  # leading zeros are not an address
    assert client_ip("256.1.1.1") == "unknown"
    assert client_ip("1.2.3.4\n") == "unknown"
    assert client_ip("::ffff:1.2.3.4") == "1.2.3.4"
    assert client_ip(None) == "unknown"


def test_an_address_with_a_port_is_keyed_by_its_address() -> None:
    """Found in review: a proxy that writes ``ip:port`` into X-Forwarded-For (some load
    balancers do), read through ProxyFix, made every caller ``unknown``: 30 clients
    shared one global bucket. ``ipv4:port`` and ``[ipv6]:port`` are the address."""
    assert client_ip("203.0.113.7:51234") == "203.0.113.7"
    assert client_ip("[2001:db8::1]:443") == "2001:db8::/64"
    assert client_ip("[::ffff:10.1.2.3]:80") == "10.1.2.3"
    for garbage in ("203.0.113.7:port", "[2001:db8::1", "host.example:80", "1.2.3.4:5:6"):
        assert client_ip(garbage) == "unknown", garbage


def test_what_does_not_parse_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """Said once per process, naming the first address that did not parse."""
    identity._told_unparsed = False  # as in a new process
    logger = logging.getLogger("flask_quota")
    with caplog.at_level(logging.WARNING, logger="flask_quota"):
        for garbage in ("still-not-one", "nor-this", "still-not-one"):
            assert parsed_ip(garbage) == "unknown"
    said = [r.getMessage() for r in caplog.records if "not an IP address" in r.getMessage()]
    state = (logger.disabled, logger.level, logger.propagate, identity._told_unparsed)
    assert len(said) == 1 and "'still-not-one'" in said[0], (said, state)


@pytest.mark.parametrize("forwarded", ["203.0.113.{i}:{port}", "[2001:db8:{i}::1]:{port}"])
def test_thirty_callers_behind_a_port_writing_proxy_get_a_bucket_each(
    app: Flask, forwarded: str
) -> None:
    app.wsgi_app = ProxyFix(app.wsgi_app, x_for=1)  # type: ignore[method-assign]
    app.config.update(QUOTA_PLANS={"free": {"global": "5/minute"}}, QUOTA_DATABASE_URL="sqlite://")
    Quota(app)

    @app.get("/")
    def index() -> str:
        return "ok"

    client = app.test_client()
    statuses = Counter(
        client.get(
            "/", headers={"X-Forwarded-For": forwarded.format(i=i, port=40000 + i)}
        ).status_code
        for i in range(30)
    )
    assert statuses == {200: 30}
