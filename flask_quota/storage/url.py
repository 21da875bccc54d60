"""``QUOTA_STORAGE_URL``: the one parser for every backend's URL.

Every error message shows the URL through ``masked``, which hides the user
info and every ``password=`` value however malformed the URL is, since
configuration errors end up in logs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["FORMS", "SCHEMES", "StorageURL", "masked", "parse_storage_url", "spellings"]

# Every scheme a QUOTA_STORAGE_URL may start with, and the scheme whose meaning it has.
# Valkey speaks the Redis protocol: its schemes mean exactly what their Redis twins mean.
SCHEMES: dict[str, str] = {
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
_ALIASES = [f"{name}://" for name, meaning in SCHEMES.items() if name != meaning]
FORMS = (
    "memory://, redis://[[user]:password@]host:6379/0, rediss://host:6380/0, "
    "unix:///path/to/redis.sock, "
    "redis+sentinel://[[user]:password@]host:26379[,host:26380...]/service_name[/db]"
    "[?sentinel_password=...], redis+cluster://[[user]:password@]host:6379[,host:6380...]; "
    f"{', '.join(_ALIASES[:-1])} and {_ALIASES[-1]} mean the same as the redis ones"
)
_DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "redis+sentinel": 26379}
_DELIMITERS = frozenset("/?#@")
# A password= value: up to the next "&", and any following "&piece" without "=" (an
# unencoded "&" in the password), "#" included.
_PASSWORD_VALUE = re.compile(r"password=([^&]*(?:&[^&=]*(?=&|$))*)", re.IGNORECASE)
_ENCODE = (
    "percent-encode '/', '?', '#' and '@' in the user name, password and options "
    "(%2F, %3F, %23, %40: urllib.parse.quote(password, safe=''))"
)


@dataclass(frozen=True)
class StorageURL:
    """A parsed storage URL. ``shown`` is safe to log: its passwords are masked.

    ``scheme`` is what the URL means (``valkey://`` means ``redis``); ``text`` is the
    URL as written.
    """

    scheme: str
    text: str
    shown: str
    hosts: tuple[tuple[str, int], ...] = ()
    username: str | None = None
    password: str | None = None
    path: tuple[str, ...] = ()
    query: dict[str, str] = field(default_factory=dict)

    @property
    def redis_url(self) -> str:
        """The URL with its scheme spelt as redis-py knows it (``valkey://`` -> ``redis://``)."""
        return f"{self.scheme}://{self.text.partition('://')[2]}"


def spellings(scheme: str) -> str:
    """Every way to write ``scheme``, e.g. ``redis+sentinel:// or valkey+sentinel://``."""
    return " or ".join(f"{name}://" for name, meaning in SCHEMES.items() if meaning == scheme)


def masked(url: str) -> str:
    """``url`` with ``***`` for its user info (all but a clean user name) and for every
    ``password=`` value. Whatever the URL, the user info is everything from ``://`` (or
    the start) to the last ``@``, so a password holding an unencoded ``/``, ``?``, ``#``
    or ``@`` is hidden whole; when in doubt, more is hidden rather than less."""
    head, sep, rest = url.partition("://")
    if not sep:
        head, rest = "", url
    hidden = [False] * len(rest)
    at = rest.rfind("@")
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        start = 0  # a user name holding a delimiter is not told from the password
        if _DELIMITERS.isdisjoint(user):
            start = len(user) + 1 if colon else at  # "user:***@", or "user@" (a name alone)
        hidden[start:at] = [True] * (at - start)
    for match in _PASSWORD_VALUE.finditer(rest):
        start, end = match.span(1)
        hidden[start:end] = [True] * (end - start)
    shown, previous = [], False
    for char, hide in zip(rest, hidden, strict=True):
        if not hide:
            shown.append(char)
        elif not previous:
            shown.append("***")
        previous = hide
    return f"{head}{sep}{''.join(shown)}"


def parse_storage_url(url: str) -> StorageURL:
    """Split a ``QUOTA_STORAGE_URL``; raise ``ValueError`` (password masked) if it is not one."""
    if not isinstance(url, str):
        raise ValueError(
            f"QUOTA_STORAGE_URL must be a string such as 'redis://host:6379/0'; {FORMS}"
        )
    shown = masked(url)
    written, sep, rest = url.partition("://")
    scheme = SCHEMES.get(written.lower()) if sep else None
    if scheme is None:
        raise ValueError(f"QUOTA_STORAGE_URL {shown!r} has an unknown scheme: use {FORMS}")
    if scheme in ("memory", "unix"):
        return StorageURL(scheme, url, shown)
    # The authority ends at the first "/", "?" or "#". An "@" past it means a password
    # holding one of those unencoded: urllib would read part of it as the host, and a
    # message quoting that host would show the password. A "#" means nothing here.
    authority = min((i for i in map(rest.find, "/?#") if i >= 0), default=len(rest))
    if "@" in rest[authority:] or "#" in rest:
        raise ValueError(f"QUOTA_STORAGE_URL {shown!r} is ambiguous: {_ENCODE}; use {FORMS}")
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed "[", or a host that changes under NFKC normalization
        # urllib's message may quote the user info: it is not repeated.
        raise ValueError(
            f"QUOTA_STORAGE_URL {shown!r} is not a URL (an unclosed '[' of an IPv6 address, "
            f"or a character not allowed in a host name); use {FORMS}"
        ) from None
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
