"""API keys: made once, shown once, stored as a salted hash plus a display prefix.

A key is ``fq_`` and 43 random URL-safe characters (256 bits). Its first 12
characters are the *prefix*: stored in clear to show in lists and to find the
candidate row, which then proves the key with a salted HMAC-SHA256. Because
the keys are random, a fast hash is enough (there is nothing to guess), and a
per-key salt needs no server secret to distribute or rotate: a copy of the
database alone never yields a usable key.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

__all__ = ["KEY_PREFIX", "PREFIX_LENGTH", "NewKey", "digest", "generate", "matches", "prefix_of"]

KEY_PREFIX = "fq_"
PREFIX_LENGTH = 12  # "fq_" + 9 random characters: 54 bits to tell keys apart


@dataclass(frozen=True, slots=True)
class NewKey:
    """A freshly made key: ``key`` is shown to the operator once and never stored."""

    key: str
    prefix: str
    salt: str
    hash: str


def generate() -> NewKey:
    """A new random key with its display prefix, salt and hash."""
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    salt = secrets.token_hex(16)
    return NewKey(key, prefix_of(key), salt, digest(key, salt))


def prefix_of(key: str) -> str:
    """The part of a key stored in clear, to show it and to find its row."""
    return key[:PREFIX_LENGTH]


def digest(key: str, salt: str) -> str:
    """The salted HMAC-SHA256 of a key, as stored."""
    return hmac.new(salt.encode(), key.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


def matches(key: str, salt: str, expected: str) -> bool:
    """Constant-time check of ``key`` against a stored salt and hash."""
    return hmac.compare_digest(digest(key, salt), expected)
