"""Networks (issue 42): operators' rules for whole networks, matched in-process.

The matcher (``core.networks``): IPv4 and IPv6, the longest prefix wins, a denial beats
an allowance of the same network, IPv4-mapped IPv6 addresses match IPv4 rules, timed
rules end on their own, and 100,000 rules match as a scan of them would. Then requests
on a real redis-server: a denied network's 403 charges nothing, an allowed network skips
the global tier only, a timed denial ends by itself; and ``quota.block(ip=CIDR)``.
"""

from __future__ import annotations

import ipaddress
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from flask import Flask, request
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from flask_quota import Identity, NetworkDenied, Quota
from flask_quota.core.networks import (
    ALLOW,
    DENY,
    NetworkRule,
    NetworkRules,
    address_value,
    parse_network,
)
from flask_quota.sql.admin import QuotaAdmin
from flask_quota.testing import FrozenClock
from tests.servers import RedisServer
from tests.sqldb import sql_store


def rule(cidr: str, action: str = DENY, expires_at: float | None = None) -> NetworkRule:
    return NetworkRule(parse_network(cidr), action, expires_at)


def decided(rules: NetworkRules, address: str) -> tuple[str, str] | None:
    """(the deciding rule's CIDR, its action) for ``address``, or None."""
    found = rules.match(address)
    return None if found is None else (found.cidr, found.action)


# -- parsing ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "normalised"),
    [
        ("203.0.113.7/24", "203.0.113.0/24"),  # host bits cleared
        ("203.0.113.9", "203.0.113.9/32"),  # a bare address: one address
        (" 10.0.0.0/255.0.0.0 ", "10.0.0.0/8"),  # a netmask, blanks around
        ("2001:DB8:0:0::1/32", "2001:db8::/32"),  # IPv6, compressed, lower case
        ("2001:db8::1", "2001:db8::1/128"),
        ("::ffff:203.0.113.0/120", "203.0.113.0/24"),  # IPv4-mapped: the IPv4 network
        ("0.0.0.0/0", "0.0.0.0/0"),
    ],
)
def test_networks_are_normalised(text: str, normalised: str) -> None:
    """A network is stored as ``ip_network(strict=False)`` writes it; a mapped IPv6
    network as its IPv4 one."""
    assert str(parse_network(text)) == normalised


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("300.1.2.3/8", "Octet 300"),
        ("10.0.0.0/33", "'33' is not a valid netmask"),
        ("abc", "Expected 4 octets"),
        ("2001:db8::/129", "'129' is not a valid netmask"),
        ("fe80::1%eth0/64", "not an IPv4 or IPv6 network"),
        ("", "not an IPv4 or IPv6 network"),
        ("10.0.0.0/8\x00", "not an IPv4 or IPv6 network"),
    ],
)
def test_garbage_is_refused_with_one_line_that_says_why(text: str, reason: str) -> None:
    """Anything but a network raises ValueError with a single line naming the problem."""
    with pytest.raises(ValueError) as info:
        parse_network(text)
    message = str(info.value)
    assert reason in message and "\n" not in message
    assert "203.0.113.0/24" in message  # the fix: an example of a network


def test_remote_addr_is_read_as_an_address() -> None:
    """IPv4, IPv6 (zone index dropped), mapped IPv6 (as IPv4), the ip:port forms some
    proxies write; anything else is no address."""
    assert address_value("203.0.113.9") == (4, int(ipaddress.ip_address("203.0.113.9")))
    assert address_value("2001:db8::1") == (6, int(ipaddress.ip_address("2001:db8::1")))
    assert address_value("fe80::1%eth0") == (6, int(ipaddress.ip_address("fe80::1")))
    assert address_value("::ffff:203.0.113.9") == address_value("203.0.113.9")
    assert address_value("203.0.113.9:51234") == address_value("203.0.113.9")
    assert address_value("[2001:db8::1]:443") == address_value("2001:db8::1")
    for junk in (None, "", "unknown", "1.2.3", "300.1.1.1", "1.2.3.4:x", "[::1]:", "::g"):
        assert address_value(junk) is None, junk


# -- matching ---------------------------------------------------------------------------


def test_ipv4_and_ipv6_rules_match_their_own_family() -> None:
    """An IPv4 rule matches IPv4 addresses inside it, an IPv6 rule IPv6 ones."""
    rules = NetworkRules([rule("203.0.113.0/24"), rule("2001:db8::/32", ALLOW)])
    assert decided(rules, "203.0.113.200") == ("203.0.113.0/24", DENY)
    assert decided(rules, "203.0.114.1") is None
    assert decided(rules, "2001:db8:ffff::7") == ("2001:db8::/32", ALLOW)
    assert decided(rules, "2001:db9::1") is None
    assert decided(rules, "::cb00:7109") is None  # 203.0.113.9's bits, but IPv6


def test_the_longest_prefix_wins() -> None:
    """A narrower rule inside a wider one decides for its own addresses, in both
    directions (an allowance inside a denial, a denial inside an allowance)."""
    rules = NetworkRules(
        [
            rule("10.0.0.0/8", DENY),
            rule("10.1.0.0/16", ALLOW),
            rule("10.1.2.0/24", DENY),
            rule("10.1.2.3/32", ALLOW),
            rule("2001:db8::/32", ALLOW),
            rule("2001:db8:bad::/48", DENY),
        ]
    )
    assert decided(rules, "10.9.9.9") == ("10.0.0.0/8", DENY)
    assert decided(rules, "10.1.9.9") == ("10.1.0.0/16", ALLOW)
    assert decided(rules, "10.1.2.9") == ("10.1.2.0/24", DENY)
    assert decided(rules, "10.1.2.3") == ("10.1.2.3/32", ALLOW)
    assert decided(rules, "2001:db8:bad::1") == ("2001:db8:bad::/48", DENY)
    assert decided(rules, "2001:db8:900d::1") == ("2001:db8::/32", ALLOW)
    assert rules.prefix_lengths == 6  # one table per distinct prefix length


def test_at_equal_prefixes_a_denial_wins() -> None:
    """Two rules for one network (in either order): the denial decides."""
    for order in ((ALLOW, DENY), (DENY, ALLOW)):
        rules = NetworkRules([rule("198.51.100.0/24", a) for a in order])
        assert decided(rules, "198.51.100.1") == ("198.51.100.0/24", DENY)


def test_ipv4_mapped_addresses_match_ipv4_rules() -> None:
    """``::ffff:203.0.113.9`` (a dual-stack socket's IPv4 client) meets the IPv4 rules,
    and a rule written as a mapped network is the IPv4 one."""
    rules = NetworkRules([rule("203.0.113.0/24"), rule("::ffff:198.51.100.0/120", ALLOW)])
    assert decided(rules, "::ffff:203.0.113.9") == ("203.0.113.0/24", DENY)
    assert decided(rules, "198.51.100.7") == ("198.51.100.0/24", ALLOW)
    assert decided(rules, "::ffff:198.51.100.7") == ("198.51.100.0/24", ALLOW)


def test_timed_rules_end_on_their_own_by_the_clock() -> None:
    """A rule stops matching at its expiry (by the injected clock, no rebuild): the
    shorter prefix under it decides again, and an allowance under an ended denial of
    the same network applies."""
    clock = FrozenClock(1_000.0)
    rules = NetworkRules(
        [
            rule("10.0.0.0/8", ALLOW),
            rule("10.1.0.0/16", DENY, expires_at=1_060.0),
            rule("192.0.2.0/24", DENY, expires_at=1_030.0),
            rule("192.0.2.0/24", ALLOW),
        ],
        clock=lambda: clock.seconds,
    )
    assert decided(rules, "10.1.2.3") == ("10.1.0.0/16", DENY)
    assert rules.seconds_left(rules.match("10.1.2.3")) == 60  # type: ignore[arg-type]
    assert decided(rules, "192.0.2.1") == ("192.0.2.0/24", DENY)
    clock.advance(30)
    assert decided(rules, "192.0.2.1") == ("192.0.2.0/24", ALLOW)
    assert decided(rules, "10.1.2.3") == ("10.1.0.0/16", DENY)
    assert rules.seconds_left(rules.match("10.1.2.3")) == 30  # type: ignore[arg-type]
    clock.advance(29.5)
    assert rules.seconds_left(rules.match("10.1.2.3")) == 1  # type: ignore[arg-type]
    clock.advance(0.5)
    assert decided(rules, "10.1.2.3") == ("10.0.0.0/8", ALLOW)


def _random_rules(rng: random.Random, count: int) -> list[NetworkRule]:
    """``count`` rules: nine in ten IPv4 /16-/32, the rest IPv6 /32-/128; a fifth allow;
    some networks twice (one denial, one allowance)."""
    rules: list[NetworkRule] = []
    while len(rules) < count:
        if rng.random() < 0.9:
            prefix = rng.randint(16, 32)
            network: ipaddress.IPv4Network | ipaddress.IPv6Network = ipaddress.IPv4Network(
                (rng.getrandbits(32) >> (32 - prefix) << (32 - prefix), prefix)
            )
        else:
            prefix = rng.randint(32, 128)
            value = (0x2001_0DB8 << 96) | rng.getrandbits(96)  # inside 2001:db8::/32
            network = ipaddress.IPv6Network((value >> (128 - prefix) << (128 - prefix), prefix))
        action = ALLOW if rng.random() < 0.2 else DENY
        rules.append(NetworkRule(network, action))
        if rng.random() < 0.01:
            rules.append(NetworkRule(network, ALLOW if action == DENY else DENY))
    return rules


def _scan(rules: list[NetworkRule], version: int, value: int) -> NetworkRule | None:
    """What ``match`` must answer, by looking at every rule: the longest prefix holding
    the address, a denial first."""
    best: NetworkRule | None = None
    for r in rules:
        n = r.network
        shift = n.max_prefixlen - n.prefixlen
        if n.version != version or value >> shift != int(n.network_address) >> shift:
            continue
        if best is None:
            best = r
            continue
        prefix, chosen = n.prefixlen, best.network.prefixlen
        if prefix > chosen or (prefix == chosen and r.deny):  # a denial beats an allowance
            best = r
    return best


def _pair(found: NetworkRule | None) -> tuple[str, str] | None:
    return None if found is None else (found.cidr, found.action)


# 100,000 rules take 14 s of CPU: under nox (other Pythons and versions, the same
# matcher code) 1,000 do.
@pytest.mark.parametrize("count", [1_000, pytest.param(100_000, marks=pytest.mark.once)])
def test_random_rules_match_as_a_scan_of_them_would(count: int) -> None:
    """``count`` random rules: every probe (inside a rule, or anywhere) gets the rule a
    scan of all of them finds, in at most one lookup per distinct prefix length."""
    rng = random.Random(42)
    rules = _random_rules(rng, count)
    built = NetworkRules(rules)
    assert len(built) == len(rules)
    lengths = {(r.network.version, r.network.prefixlen) for r in rules}
    assert built.prefix_lengths == len(lengths) <= 17 + 97  # v4 /16-/32, v6 /32-/128
    probes: list[tuple[int, int]] = []
    for r in rng.sample(rules, 60):  # inside a rule: a match is certain
        n = r.network
        host_bits = n.max_prefixlen - n.prefixlen
        probes.append((n.version, int(n.network_address) | rng.getrandbits(host_bits)))
    probes += [(4, rng.getrandbits(32)) for _ in range(30)]
    probes += [(6, (0x2001_0DB8 << 96) | rng.getrandbits(96)) for _ in range(10)]
    answers = [_pair(built.match_value(version, value)) for version, value in probes]
    assert answers == [_pair(_scan(rules, version, value)) for version, value in probes]
    assert sum(a is not None for a in answers) >= 60
    assert any(a is not None and a[1] == ALLOW for a in answers)  # both actions decided
    assert any(a is not None and a[1] == DENY for a in answers)
    # The same answers through the text a request gives (REMOTE_ADDR).
    texts = [str(ipaddress.ip_address(value)) for _, value in probes]
    assert [_pair(built.match(text)) for text in texts] == answers


# -- the problem body -----------------------------------------------------------------


def test_the_403_is_a_problem_with_retry_after_only_when_timed() -> None:
    """NetworkDenied renders RFC 9457 JSON with ``"tier": "network"``; a timed denial
    adds Retry-After and ``retry_after``, one without an end neither."""
    forever = NetworkDenied("203.0.113.0/24").get_response()
    assert forever.status_code == 403
    assert forever.headers["Content-Type"] == "application/problem+json"
    assert "Retry-After" not in forever.headers
    body = forever.get_json()
    assert body == {
        "type": "about:blank", "title": "Forbidden", "status": 403, "tier": "network",
        "detail": "Requests from your network are refused by the operators of this service.",
    }  # fmt: skip
    timed = NetworkDenied("203.0.113.0/24", 42).get_response()
    assert timed.headers["Retry-After"] == "42"
    assert timed.get_json()["retry_after"] == 42 and "42 more s" in timed.get_json()["detail"]


# -- requests -------------------------------------------------------------------------

PLANS = {"free": {"global": "3/minute", "user": "5/minute", "resources": {"ai": "4/minute"}}}


@dataclass
class Site:
    """An app, its ``Quota`` and a test client."""

    app: Flask
    quota: Quota
    http: FlaskClient

    def admin(self) -> QuotaAdmin:
        return QuotaAdmin(sql_store(self.app), actor="t")

    def call(self, address: str, user: str | None = None, path: str = "/items") -> TestResponse:
        """One request from ``address`` (``user`` in X-User; none: anonymous); ``/infer``
        is a POST."""
        return self.http.open(
            path, method="POST" if path == "/infer" else "GET",
            headers={"X-User": user} if user else {}, environ_base={"REMOTE_ADDR": address},
        )  # fmt: skip

    def buckets(self, identity: str | None = None, ip: str | None = None) -> dict[str, int]:
        with self.app.app_context():
            return {b.name: b.remaining for b in self.quota.peek(identity=identity, ip=ip)}


@pytest.fixture
def site(tmp_path: Path, redis_client: redis.Redis, redis_server: RedisServer) -> Iterator[Site]:
    """Counters in a real redis-server (flushed), rules in a SQLite file; callers name
    themselves in X-User (none: anonymous, keyed by IP)."""
    app = Flask(__name__, instance_path=str(tmp_path / "instance"))
    app.config.update(
        QUOTA_PLANS=PLANS,
        QUOTA_STORAGE_URL=redis_server.url,
        QUOTA_DATABASE_URL=f"sqlite:///{tmp_path / 'quota.sqlite3'}",
        QUOTA_STORAGE_TIMEOUT=2,
    )
    quota = Quota(app)

    @quota.identity_loader
    def from_header() -> Identity | None:
        user = request.headers.get("X-User")
        return Identity(user) if user else None

    @app.get("/items")
    def items() -> str:
        return "items"

    @app.post("/infer")
    @quota.limit(resource="ai")
    def infer() -> str:
        return "inferred"

    @app.get("/health")
    @quota.exempt
    def health() -> str:
        return "ok"

    sql = sql_store(app)
    sql.start()
    assert sql.wait_loaded(10)
    yield Site(app, quota, app.test_client())
    sql.close()


@pytest.mark.redis
def test_no_rules_means_no_matcher_at_all(site: Site) -> None:
    """Without rows the store serves no matcher (the edge's one attribute check); the
    first rule brings one, removing the last takes it away."""
    sql = sql_store(site.app)
    assert sql.networks is None
    site.admin().deny_network("203.0.113.0/24")
    assert sql.networks is not None and len(sql.networks) == 1
    site.admin().remove_network("203.0.113.0/24")
    assert sql.networks is None


@pytest.mark.redis
def test_a_reload_for_another_change_keeps_the_rules_it_has(site: Site) -> None:
    """A plan change reloads the snapshot but reuses the parsed rules (same rows); a
    network change builds them again."""
    sql = sql_store(site.app)
    site.admin().deny_network("203.0.113.0/24")
    rules = sql.networks
    version = sql.catalog().version  # type: ignore[attr-defined]
    site.admin().set_plan_limit("free", "user", "6/minute")
    assert sql.catalog().version > version  # type: ignore[attr-defined]
    assert sql.networks is rules
    assert site.call("10.0.0.1", "amy").headers["RateLimit-Policy"].endswith('"user";q=6;w=60')
    site.admin().set_network("203.0.113.0/24", ALLOW)
    assert sql.networks is not rules and sql.networks is not None
    assert site.call("203.0.113.9").status_code == 200


@pytest.mark.redis
def test_a_denied_network_gets_403_and_charges_nothing(
    site: Site, redis_client: redis.Redis
) -> None:
    """A request from a denied network is refused with the 403 problem before any
    storage call: no key is written, its buckets stay full; the next network serves."""
    site.admin().deny_network("203.0.113.0/24", reason="scrapers")
    for path, user in (("/items", "u1"), ("/infer", "u1"), ("/items", None)):
        response = site.call("203.0.113.9", user, path)
        assert response.status_code == 403, path
        assert response.headers["Content-Type"] == "application/problem+json"
        assert response.get_json()["tier"] == "network"
        assert "Retry-After" not in response.headers  # not timed
        assert "RateLimit-Policy" not in response.headers  # no tier was decided
    assert redis_client.keys("*") == []  # nothing charged, nothing read into a key
    assert site.buckets("u1", "203.0.113.9") == {"global": 3, "user": 5, "ai (POST)": 4}
    # An exempt view is not the edge's business; the next network is served as usual.
    assert site.http.get("/health", environ_base={"REMOTE_ADDR": "203.0.113.9"}).status_code == 200
    served = site.call("203.0.114.1")
    assert served.status_code == 200 and '"global";q=3' in served.headers["RateLimit-Policy"]
    # IPv6 and IPv4-mapped callers meet the same rules.
    site.admin().deny_network("2001:db8::/32")
    assert site.call("2001:db8::5").status_code == 403
    assert site.call("2001:db9::5").status_code == 200
    assert site.call("::ffff:203.0.113.77").status_code == 403


@pytest.mark.redis
def test_an_allowed_network_skips_the_global_tier_only(
    site: Site, redis_client: redis.Redis
) -> None:
    """From an allowed network the per-IP global tier neither limits nor is charged
    (not in the headers, its bucket untouched), while the user and endpoint tiers still
    limit the caller; from another address the global tier limits as before."""
    site.admin().set_network("10.0.0.0/8", ALLOW, reason="office")
    statuses = []
    for _ in range(6):
        response = site.call("10.1.2.3", "amy")
        statuses.append(response.status_code)
        if response.status_code == 200:
            assert response.headers["RateLimit-Policy"] == '"user";q=5;w=60'
    assert statuses == [200] * 5 + [429]  # past 3 (global), stopped at 5 (user)
    assert response.get_json()["tier"] == "user"
    assert site.buckets(ip="10.1.2.3")["global"] == 3  # never charged
    assert not [k for k in redis_client.keys("*") if b"ip=10.1.2.3" in k and b":g:" in k]
    assert [k for k in redis_client.keys("*") if b"id=amy" in k]  # the user tier's bucket
    # The endpoint tier of the view still applies (4/minute on "ai").
    assert [site.call("10.1.2.3", "bo", "/infer").status_code for _ in range(5)] == [200] * 4 + [
        429
    ]
    # Another address: the global tier stops it at 3.
    assert [site.call("11.1.2.3", "cy").status_code for _ in range(4)] == [200, 200, 200, 429]


@pytest.mark.redis
def test_an_anonymous_caller_from_an_allowed_network_keeps_its_user_tier(site: Site) -> None:
    """Anonymous callers are keyed by IP on the user tier (the anonymous plan's budget):
    an allowance drops only the global tier, so the user tier still stops them at 5."""
    site.admin().set_network("10.0.0.0/8", ALLOW)
    responses = [site.call("10.9.9.9") for _ in range(6)]
    assert [r.status_code for r in responses] == [200] * 5 + [429]
    assert responses[0].headers["RateLimit-Policy"] == '"user";q=5;w=60'
    assert responses[-1].get_json()["tier"] == "user"


@pytest.mark.redis
def test_the_route_cache_keeps_allowed_and_other_routes_apart(site: Site) -> None:
    """The same plan, endpoint and method from an allowed network and from elsewhere,
    in either order: each request gets its own route, the global tier only elsewhere."""
    site.admin().set_network("10.0.0.0/8", ALLOW)
    calls = [("11.0.0.1", "/items"), ("10.0.0.1", "/items"), ("11.0.0.2", "/items"),
             ("10.0.0.2", "/items"), ("11.0.0.3", "/infer"), ("10.0.0.3", "/infer"),
             ("11.0.0.4", "/infer")]  # fmt: skip
    for n, (address, path) in enumerate(calls):
        policy = site.call(address, f"user{n}", path).headers["RateLimit-Policy"]
        assert ('"global"' in policy) == address.startswith("11."), (address, policy)
        assert ('"ai"' in policy) == (path == "/infer"), (path, policy)


@pytest.mark.redis
def test_a_timed_denial_ends_by_itself(site: Site) -> None:
    """A denial for 1 s (its end rounded up to a whole second) answers 403 with the
    seconds left in Retry-After; at its end, with no change to the tables and the same
    rules in the process, the network is served again."""
    info = site.admin().deny_network("198.51.100.0/24", expires_in=timedelta(seconds=1))
    assert info.expires_at is not None
    rules = sql_store(site.app).networks
    denied = site.call("198.51.100.4")
    assert denied.status_code == 403 and denied.headers["Retry-After"] in ("1", "2")
    assert denied.get_json()["retry_after"] == int(denied.headers["Retry-After"])
    time.sleep(max(0.0, info.expires_at.timestamp() - time.time()) + 0.05)
    assert site.call("198.51.100.4").status_code == 200
    assert sql_store(site.app).networks is rules  # ended by the clock, not by a reload
    assert site.admin().networks() == []  # nor listed once it has ended


@pytest.mark.redis
def test_quota_block_with_a_network_denies_it_for_a_while(site: Site) -> None:
    """``quota.block(ip=CIDR)`` writes a timed, audited denial (403 with Retry-After);
    ``quota.unblock(ip=CIDR)`` removes it; a plain address (or its /32) is still
    blocked as the caller it is (429 "blocked"); ``public=`` is refused for a network."""
    quota, app = site.quota, site.app
    with app.app_context():
        assert quota.block(ip="203.0.113.0/24", seconds=300, reason="scan") == ["203.0.113.0/24"]
    denied = site.call("203.0.113.50")
    assert denied.status_code == 403 and 295 <= int(denied.headers["Retry-After"]) <= 301
    [found] = site.admin().networks()
    assert (found.cidr, found.action, found.reason, found.created_by) == (
        "203.0.113.0/24", DENY, "scan", "api",
    )  # fmt: skip
    assert found.expires_at is not None
    with app.app_context():
        assert quota.block(ip="198.51.100.7/32", seconds=300) == ["ip=198.51.100.7"]
        with pytest.raises(ValueError, match="public"):
            quota.block(ip="192.0.2.0/24", seconds=60, public=True)
        with pytest.raises(ValueError, match="not an IPv4 or IPv6 network"):
            quota.block(ip="192.0.2.0/40", seconds=60)
    blocked = site.call("198.51.100.7")
    assert blocked.status_code == 429 and blocked.get_json()["tier"] == "blocked"
    assert len(site.admin().networks()) == 1  # the refused calls wrote nothing
    with app.app_context():
        assert quota.unblock(ip="203.0.113.0/24") == ["203.0.113.0/24"]
        assert quota.unblock(ip="203.0.113.0/24") == []  # nothing left to lift
        assert quota.unblock(ip="198.51.100.7") == ["ip=198.51.100.7"]
    assert site.call("203.0.113.50").status_code == 200
    actions = [(e.actor, e.action, e.target) for e in reversed(site.admin().audit_log())]
    assert ("api", "network.deny", "network:203.0.113.0/24") in actions
    assert ("api", "network.remove", "network:203.0.113.0/24") in actions
    assert ("api", "block", "ip=198.51.100.7") in actions


@pytest.mark.redis
def test_an_allowance_is_not_lifted_by_unblock(site: Site) -> None:
    """``quota.unblock(ip=CIDR)`` removes denials only: an allowance stays."""
    site.admin().set_network("10.0.0.0/8", ALLOW)
    with site.app.app_context():
        assert site.quota.unblock(ip="10.0.0.0/8") == []
    assert [(n.cidr, n.action) for n in site.admin().networks()] == [("10.0.0.0/8", ALLOW)]
