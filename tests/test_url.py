"""``QUOTA_STORAGE_URL`` parsing: the Valkey schemes, and passwords that never reach a message.

No server is needed: parsing and building a backend make no connection.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

import pytest
from flask import Flask

from flask_quota import Quota
from flask_quota.storage import storage_from_url
from flask_quota.storage.cluster import ClusterStorage
from flask_quota.storage.redis import RedisStorage
from flask_quota.storage.sentinel import SentinelStorage, parse_sentinel_url
from flask_quota.storage.url import FORMS, SCHEMES, masked, parse_storage_url

# -- Valkey schemes -----------------------------------------------------------------

# (valkey scheme, its redis twin, the rest of a URL valid for both)
TWINS = [
    ("valkey", "redis", "127.0.0.1:6379/0"),
    ("valkey", "redis", "bob:p%40ss@cache.internal:7000/3?socket_timeout=2"),
    ("valkey", "redis", "[::1]/1"),
    ("valkeys", "rediss", "bob:pw@cache.internal:6380/0?ssl_cert_reqs=none"),
    ("valkey+sentinel", "redis+sentinel", "h1:26379,h2:26380/mymaster/2?sentinel_password=x"),
    ("valkey+sentinel", "redis+sentinel", ":pw@h1/mymaster"),
    ("valkey+cluster", "redis+cluster", "u:pw@n1:7000,n2:7001,[::1]:7002"),
]


@pytest.mark.parametrize(("valkey", "redis", "rest"), TWINS)
def test_a_valkey_scheme_parses_as_its_redis_twin(valkey: str, redis: str, rest: str) -> None:
    """``valkey://``, ``valkeys://``, ``valkey+sentinel://`` and ``valkey+cluster://`` mean
    exactly what the redis schemes mean: same backend scheme, hosts, user, password, path
    and options. Only the URL shown in messages keeps the spelling the user wrote."""
    ours, twin = parse_storage_url(f"{valkey}://{rest}"), parse_storage_url(f"{redis}://{rest}")
    assert ours.scheme == twin.scheme == redis
    assert (ours.hosts, ours.username, ours.password, ours.path, ours.query) == (
        twin.hosts,
        twin.username,
        twin.password,
        twin.path,
        twin.query,
    )
    assert ours.shown == twin.shown.replace(f"{redis}://", f"{valkey}://", 1)
    assert ours.redis_url == twin.redis_url == f"{redis}://{rest}"


def test_valkey_schemes_are_case_insensitive() -> None:
    """Schemes are case-insensitive (RFC 3986), Valkey's as Redis's."""
    assert parse_storage_url("VALKEY+Cluster://n1:7000").scheme == "redis+cluster"
    assert parse_storage_url("Valkeys://h:6380/0").redis_url == "rediss://h:6380/0"


def test_one_table_lists_every_scheme() -> None:
    """The table of schemes is the one place a scheme is accepted: each Valkey scheme maps to
    its Redis twin, every other scheme to itself."""
    assert SCHEMES == {
        "memory": "memory",
        "unix": "unix",
        "redis": "redis",
        "rediss": "rediss",
        "redis+sentinel": "redis+sentinel",
        "redis+cluster": "redis+cluster",
        "valkey": "redis",
        "valkeys": "rediss",
        "valkey+sentinel": "redis+sentinel",
        "valkey+cluster": "redis+cluster",
    }


@pytest.mark.parametrize("url", ["valkeyy://h:6379", "vaalkey+cluster://h", "keydb://h:6379/0"])
def test_unknown_scheme_error_lists_the_valkey_schemes(url: str) -> None:
    """A mistyped scheme is refused with a message listing every accepted scheme, Valkey's too."""
    with pytest.raises(ValueError, match="unknown scheme") as info:
        parse_storage_url(url)
    for scheme in SCHEMES:
        assert f"{scheme}://" in str(info.value), scheme
    assert str(info.value).endswith(FORMS)


def test_valkey_sentinel_url_gives_what_the_redis_one_gives() -> None:
    """``valkey+sentinel://`` reaches the Sentinel backend with the same sentinels, service,
    database and passwords; a bad one is refused naming the Valkey form."""
    rest = "u:pw@h1:26379,h2/mymaster/4?sentinel_password=spw"
    assert parse_sentinel_url(f"valkey+sentinel://{rest}") == parse_sentinel_url(
        f"redis+sentinel://{rest}"
    )
    with pytest.raises(ValueError, match="is not a Sentinel URL") as info:
        parse_sentinel_url("valkey+sentinel://h1:26379")
    assert "redis+sentinel:// or valkey+sentinel://" in str(info.value)


@pytest.mark.parametrize(
    ("url", "backend"),
    [
        ("valkey://127.0.0.1:1/0", RedisStorage),
        ("valkeys://127.0.0.1:1/0", RedisStorage),
        ("valkey+sentinel://127.0.0.1:1/mymaster", SentinelStorage),
        ("valkey+cluster://127.0.0.1:1", ClusterStorage),
    ],
)
def test_valkey_urls_build_the_redis_backends(url: str, backend: type[object]) -> None:
    """``storage_from_url`` builds the backend the redis twin builds (no connection is made)."""
    storage = storage_from_url(url, timeout=0.1)
    assert type(storage) is backend


def test_valkeys_means_tls() -> None:
    """``valkeys://`` connects with TLS, as ``rediss://`` does."""
    storage = storage_from_url("valkeys://127.0.0.1:1/0", timeout=0.1)
    assert isinstance(storage, RedisStorage)
    kwargs = storage.client.connection_pool.connection_kwargs
    assert storage.client.connection_pool.connection_class.__name__ == "SSLConnection"
    assert kwargs["port"] == 1


# -- the password never appears -----------------------------------------------------

# Each secret is two words: neither may appear in any message, nor may its encoded form.
SECRETS = ["Alpha/Bravo", "Alpha#Bravo", "Alpha?Bravo", "Alpha/?#Bravo", "Alpha@/Bravo"]
WORDS = ("Alpha", "Bravo")

# URL shapes with the secret unencoded where a password goes. {s} is the scheme.
SHAPES = [
    "{s}://:{pw}@cache.internal:6379/0",
    "{s}://bob:{pw}@cache.internal:6379/0",
    "{s}://bob:{pw}@cache.internal/0",
    "{s}://:{pw}@cache.internal",
    "{s}://bob:{pw}@h1:26379,h2:26380/mymaster",
    "{s}://bob:{pw}@[::1]:6379/0",
    "{s}://bob:{pw}@",
    "{s}://:{pw}@:notaport/0",
    "{s}://bob:{pw}@h1:26379/mymaster?sentinel_password={pw}",
    "{s}://:{pw}@[::1/0",
]
# URLs refused for another reason, with a password that is fine: it must not show either.
REFUSED = [
    "{s}://bob:AlphaBravo@[::1/0",  # an unclosed "["
    "{s}://bob:AlphaBravo@host\uff0fname:6379/0",  # a host urllib refuses after NFKC
    "{s}://bob:AlphaBravo@host:notaport/0",
    "{s}://bob:AlphaBravo@",
    "{s}://h1:26379/mymaster?sentinel_password=Alpha#Bravo",  # "#": a fragment, ambiguous
    "{s}://h1:26379/mymaster?sentinel_password=Alpha@Bravo",
]
HOST_SCHEMES = [s for s in SCHEMES if s not in ("memory", "unix")]
MALFORMED = [
    shape.format(s=scheme, pw=secret)
    for scheme in HOST_SCHEMES
    for shape in SHAPES
    for secret in SECRETS
] + [shape.format(s=scheme) for scheme in HOST_SCHEMES for shape in REFUSED]
# Not even a known scheme: the secret must still be hidden in the "unknown scheme" error.
ODD = [
    f"{prefix}:{secret}@cache.internal:6379/0"
    for prefix in ("redis:/", "redis:", "redis//", "redis:///", "bob", "mongodb://bob")
    for secret in SECRETS
]


def leaked(text: str) -> list[str]:
    """The secret's words found in ``text``, plain or percent-encoded."""
    return [word for word in WORDS if word in text or word.lower() in text.lower()]


def every_text_of(exc: BaseException) -> str:
    """What could reach a log: the message, its repr and the whole formatted traceback."""
    return "\n".join([str(exc), repr(exc), *traceback.format_exception(exc)])


@pytest.mark.parametrize("url", MALFORMED + ODD)
def test_a_malformed_url_never_shows_its_password(url: str) -> None:
    """However malformed the URL (a password with an unencoded ``/``, ``#`` or ``?``, a bad
    host, an unknown scheme), the error raised while parsing it or building its backend
    never contains the password, whole or in part."""
    for build in (parse_storage_url, lambda u: storage_from_url(u, timeout=0.1)):
        with pytest.raises(ValueError, match="QUOTA_STORAGE_URL") as info:
            build(url)
        assert not leaked(every_text_of(info.value)), every_text_of(info.value)
    assert not leaked(masked(url)), masked(url)


@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize(
    "url",
    [
        "unix://bob:{pw}@/run/redis.sock?db=1",
        "unix:///run/redis.sock?db=1&password={pw}",
        "memory://:{pw}@x",
    ],
)
def test_unix_and_memory_urls_never_show_the_password(url: str, secret: str) -> None:
    """``unix://`` and ``memory://`` URLs are not split by us, but whatever becomes of them
    (a backend, or redis-py's refusal), no message and no masked form shows the password."""
    url = url.format(pw=secret)
    assert not leaked(masked(url)), masked(url)
    try:
        storage_from_url(url, timeout=0.1).close()
    except ValueError as exc:
        assert not leaked(every_text_of(exc)), every_text_of(exc)


@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize("scheme", HOST_SCHEMES)
def test_an_unencoded_password_is_refused_with_how_to_encode_it(scheme: str, secret: str) -> None:
    """A password whose ``/``, ``#`` or ``?`` is not percent-encoded is refused at start-up
    (not read as a host, a path or a query), and the message says how to encode it."""
    url = f"{scheme}://bob:{secret}@cache.internal:6379/0"
    with pytest.raises(ValueError, match="percent-encode") as info:
        parse_storage_url(url)
    assert "%2F" in str(info.value)
    assert not leaked(str(info.value))


@pytest.mark.parametrize("url", [u for u in MALFORMED if "valkey" not in u][::7] + ODD[::5])
def test_init_app_neither_raises_nor_logs_the_password(
    url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Through ``Quota(app)``, as an app meets it: neither the error nor any log line written
    while the app starts shows the password."""
    caplog.set_level(logging.DEBUG)
    app = Flask(__name__, instance_path=str(tmp_path))
    app.config["QUOTA_STORAGE_URL"] = url
    with pytest.raises(ValueError, match="QUOTA_STORAGE_URL") as info:
        Quota(app)
    assert not leaked(every_text_of(info.value)), every_text_of(info.value)
    for record in caplog.records:
        line = record.getMessage() + (record.exc_text or "")
        assert not leaked(line), line


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://bob:Alpha/Bravo@h:6379/0", "redis://bob:***@h:6379/0"),
        ("redis://:Alpha#Bravo@h:6379/0", "redis://:***@h:6379/0"),
        ("valkey://bob:Alpha?Bravo@h", "valkey://bob:***@h"),
        ("redis:/bob:Alpha@h:6379", "redis:***@h:6379"),
        ("redis+sentinel://h/m?sentinel_password=Alpha@Bravo&db=1", "redis+sentinel://***&db=1"),
        (
            "redis+sentinel://h/m?sentinel_password=Alpha&Bravo",
            "redis+sentinel://h/m?sentinel_password=***",
        ),
        (
            "redis://bob:pw@h:6379/2?ssl=1&password=x",
            "redis://bob:***@h:6379/2?ssl=1&password=***",
        ),
    ],
)
def test_masked_hides_userinfo_however_it_is_malformed(url: str, shown: str) -> None:
    """``masked`` hides everything between ``://`` and the last ``@`` but a clean user name,
    and every ``password=`` value, even one holding ``@`` or ``&``."""
    text = masked(url)
    assert not leaked(text), text
    assert text == shown
