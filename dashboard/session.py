"""The dashboard's own cookie: its CSRF secret and one-shot messages.

The dashboard keeps nothing in the host app's Flask session, so it never sets or
re-sets the host's ``session`` cookie, and the host's session settings stay the
host's. Its state lives in one cookie of its own (``COOKIE``):

- scoped to the dashboard's URL prefix, ``HttpOnly``, ``SameSite=Lax`` (a
  cross-site POST does not carry it, so a forged form fails twice over), and
  ``Secure`` when the request came over HTTPS (or ``SESSION_COOKIE_SECURE`` is set);
- signed with the app's ``secret_key`` (a salt of its own, so it cannot stand in
  for the host's session cookie or the reverse), and ending with the browser session.

A form's CSRF token is the cookie's random secret, signed and timestamped: it is
valid for ``TOKEN_MAX_AGE`` seconds, and only with the cookie of the browser that
got it.

A secret shown once (a new client's API key) crosses the redirect after its form
(Post/Redirect/Get) in the cookie, encrypted with a key derived from ``secret_key``
(HMAC-SHA256 in counter mode, a random nonce each time): the signed cookie can be
decoded by anyone who holds it, the secret cannot. The next page shows it and drops it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Any

from flask import Response, current_app, g, request, url_for
from itsdangerous import BadSignature, URLSafeSerializer, URLSafeTimedSerializer

__all__ = ["COOKIE", "TOKEN_MAX_AGE", "DashboardSession", "current", "flash"]

COOKIE = "quota_dashboard_session"
TOKEN_MAX_AGE = 3600  # seconds a form may stay open before its token expires
_MAX_MESSAGES = 10


class DashboardSession:
    """This request's view of the cookie; ``save`` writes it back if it changed."""

    def __init__(self, raw: str | None) -> None:
        data: Any = None
        if raw:
            try:
                data = self._cookie_serializer().loads(raw)
            except BadSignature:
                data = None
        data = data if isinstance(data, dict) else {}
        secret, messages = data.get("csrf"), data.get("messages")
        self.secret: str | None = secret if isinstance(secret, str) and secret else None
        reveal = data.get("reveal")
        self.reveal: str | None = reveal if isinstance(reveal, str) and reveal else None
        self.messages: list[tuple[str, str]] = [
            (str(m[0]), str(m[1]))
            for m in (messages if isinstance(messages, list) else [])
            if isinstance(m, list) and len(m) == 2
        ]
        self.changed = False

    # -- CSRF ----------------------------------------------------------------

    def csrf_token(self) -> str:
        """A token for a form of this page (the secret is made on first use)."""
        if self.secret is None:
            self.secret = secrets.token_hex(32)
            self.changed = True
        token: str = self._token_serializer().dumps(self.secret)
        return token

    def csrf_valid(self, token: str | None) -> bool:
        """True when ``token`` was issued to this browser less than TOKEN_MAX_AGE ago."""
        if not token or self.secret is None:
            return False
        try:
            secret = self._token_serializer().loads(token, max_age=TOKEN_MAX_AGE)
        except BadSignature:  # also SignatureExpired
            return False
        return isinstance(secret, str) and hmac.compare_digest(secret, self.secret)

    # -- one-shot messages (what Flask's flash() does, in our cookie) ---------

    def flash(self, category: str, message: str) -> None:
        self.messages = [*self.messages, (category, message)][-_MAX_MESSAGES:]
        self.changed = True

    def pop_messages(self) -> list[tuple[str, str]]:
        shown, self.messages = self.messages, []
        if shown:
            self.changed = True
        return shown

    # -- a secret shown once, on the next page --------------------------------

    def keep_secret(self, value: str) -> None:
        """Carry ``value`` (encrypted) to the next page that calls ``pop_secret``."""
        nonce = secrets.token_bytes(16)
        data = value.encode()
        sealed = bytes(a ^ b for a, b in zip(data, _keystream(nonce, len(data)), strict=True))
        self.reveal = base64.urlsafe_b64encode(nonce + sealed).decode()
        self.changed = True

    def pop_secret(self) -> str | None:
        """The value ``keep_secret`` kept, once; None when there is none (or it does not
        decrypt: a cookie made under another ``secret_key``)."""
        if self.reveal is None:
            return None
        raw, self.reveal, self.changed = self.reveal, None, True
        try:
            blob = base64.urlsafe_b64decode(raw)
        except ValueError:
            return None
        nonce, sealed = blob[:16], blob[16:]
        data = bytes(a ^ b for a, b in zip(sealed, _keystream(nonce, len(sealed)), strict=True))
        try:
            return data.decode()
        except UnicodeDecodeError:
            return None

    # -- the cookie ----------------------------------------------------------

    def save(self, response: Response) -> None:
        if not self.changed:
            return
        found: dict[str, Any] = {"csrf": self.secret, "messages": [list(m) for m in self.messages]}
        if self.reveal is not None:
            found["reveal"] = self.reveal
        value = self._cookie_serializer().dumps(found)
        response.set_cookie(
            COOKIE,
            value,
            path=cookie_path(),
            secure=request.is_secure or bool(current_app.config.get("SESSION_COOKIE_SECURE")),
            httponly=True,
            samesite="Lax",
        )
        response.vary.add("Cookie")

    @staticmethod
    def _cookie_serializer() -> URLSafeSerializer:
        return URLSafeSerializer(current_app.secret_key or "", salt="flask-quota dashboard cookie")

    @staticmethod
    def _token_serializer() -> URLSafeTimedSerializer:
        return URLSafeTimedSerializer(
            current_app.secret_key or "", salt="flask-quota dashboard csrf"
        )


def _keystream(nonce: bytes, size: int) -> bytes:
    """``size`` bytes of HMAC-SHA256(key, nonce || counter), the key derived from the
    app's ``secret_key`` for this use only."""
    secret = current_app.secret_key or ""
    raw = secret if isinstance(secret, bytes) else str(secret).encode()
    key = hmac.new(raw, b"flask-quota dashboard secret shown once", hashlib.sha256).digest()
    blocks = (size + 31) // 32
    stream = b"".join(
        hmac.new(key, nonce + i.to_bytes(4, "big"), hashlib.sha256).digest() for i in range(blocks)
    )
    return stream[:size]


def cookie_path() -> str:
    """The dashboard's URL prefix (``/quota``), so the cookie goes to its pages only."""
    return url_for("quota_dashboard.overview_page").rstrip("/") or "/"


def current() -> DashboardSession:
    """The dashboard cookie of this request (read once)."""
    found: DashboardSession | None = g.get("_quota_dashboard_session")
    if found is None:
        found = g._quota_dashboard_session = DashboardSession(request.cookies.get(COOKIE))
    return found


def flash(message: str, category: str) -> None:
    """Show ``message`` on the next dashboard page this browser renders."""
    current().flash(category, message)
