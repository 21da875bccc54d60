"""``QUOTA_STORAGE_URL``: the one parser for every backend's URL.

Every error message shows the URL with its passwords masked, since
configuration errors end up in logs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["FORMS", "SCHEMES", "StorageURL", "masked", "parse_storage_url"]

SCHEMES = ("memory", "redis", "rediss", "unix", "redis+sentinel", "redis+cluster")
FORMS = (
    "memory://, redis://[[user]:password@]host:6379/0, rediss://host:6380/0, "
    "unix:///path/to/redis.sock, "
    "redis+sentinel://[[user]:password@]host:26379[,host:26380...]/service_name[/db]"
    "[?sentinel_password=...], redis+cluster://[[user]:password@]host:6379[,host:6380...]"
)
_DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "redis+sentinel": 26379}


@dataclass(frozen=True)
class StorageURL:
    """A parsed storage URL. ``shown`` is safe to log: its passwords are masked."""

    scheme: str
    text: str
    shown: str
    hosts: tuple[tuple[str, int], ...] = ()
    username: str | None = None
    password: str | None = None
    path: tuple[str, ...] = ()
    query: dict[str, str] = field(default_factory=dict)


def masked(url: str) -> str:
    """``url`` with the password of its user info and any ``*password=`` query value hidden."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, tail = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at and ":" in userinfo:
        userinfo = userinfo.partition(":")[0] + ":***"
    text = f"{scheme}://{userinfo}{at}{hosts}{slash}{tail}"
    base, q, query = text.partition("?")
    if q:
        pairs = [
            (k + "=***" if k.endswith("password") else f"{k}={v}")
            for k, _, v in (pair.partition("=") for pair in query.split("&"))
        ]
        text = base + "?" + "&".join(pairs)
    return text


def parse_storage_url(url: str) -> StorageURL:
    """Split a ``QUOTA_STORAGE_URL``; raise ``ValueError`` (password masked) if it is not one."""
    if not isinstance(url, str):
        raise ValueError(
            f"QUOTA_STORAGE_URL must be a string such as 'redis://host:6379/0'; {FORMS}"
        )
    shown = masked(url)
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in SCHEMES:
        raise ValueError(f"QUOTA_STORAGE_URL {shown!r} has an unknown scheme: use {FORMS}")
    if scheme in ("memory", "unix"):
        return StorageURL(scheme, url, shown)
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # e.g. an unclosed "[" of an IPv6 address
        raise ValueError(f"QUOTA_STORAGE_URL {shown!r} is not a URL ({exc}); use {FORMS}") from None
    userinfo, _, netloc = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    hosts = tuple(_address(a, scheme, shown) for a in netloc.split(",") if a)
    if not hosts or (len(hosts) > 1 and scheme in ("redis", "rediss")):
        raise ValueError(f"QUOTA_STORAGE_URL {shown!r} needs host:port; use {FORMS}")
    path = tuple(unquote(p) for p in parts.path.split("/") if p)
    query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
    return StorageURL(
        scheme,
        url,
        shown,
        hosts,
        unquote(username) or None,
        unquote(password) or None,
        path,
        query,
    )


def _address(address: str, scheme: str, shown: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``; the port may default by scheme."""
    if address.startswith("["):
        host, _, rest = address[1:].partition("]")
        port = rest.removeprefix(":") if rest.startswith(":") or not rest else "bad"
    else:
        host, _, port = address.rpartition(":") if address.count(":") == 1 else (address, "", "")
    default = _DEFAULT_PORTS.get(scheme)
    if not port and default is not None:
        port = str(default)
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"QUOTA_STORAGE_URL {shown!r}: {address!r} is not host:port; use {FORMS}")
    return host, int(port)
