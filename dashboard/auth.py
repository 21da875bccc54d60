"""Who may open the dashboard: a host callable or HTTP Basic with Werkzeug hashes.

Failed Basic logins are rate limited (``LOGIN_RATE``), through the quota storage
when it answers (shared by all workers) and in-process otherwise:

- Every password check is charged to the failure budget *before* it runs and
  refunded when the password is right, so concurrent guesses cannot outrun the
  budget, and a correct password costs nothing.
- The budget belongs to the caller's IP, or, for a browser that has logged in
  before, to that browser (a signed ``DEVICE_COOKIE``, which is no credential:
  it only names the budget). Guesses from behind the operator's NAT exhaust the
  IP's budget, not the operator's. A client without that cookie (a fresh browser,
  curl) waits like any guesser: answering its correct password while the IP is
  throttled would tell a guesser when a guess is right, without limit.
- An unknown user name is checked against a dummy hash of the same method, so
  the answer takes as long as for a real user and does not tell which exist.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from flask import Response, after_this_request, current_app, request, url_for
from itsdangerous import BadSignature, URLSafeTimedSerializer
from werkzeug.security import check_password_hash

from flask_quota import Algorithm, Rate, parse_rate
from flask_quota.admin_api import Check, KeyBuilder, MemoryStorage, Storage, StorageError, client_ip

__all__ = ["DEVICE_COOKIE", "LOGIN_RATE", "Authenticator", "auth_from_config"]

LOGIN_RATE = parse_rate("10/minute")
DEVICE_COOKIE = "quota_dashboard_device"
DEVICE_DAYS = 30
MAX_PASSWORD = 1024  # longer ones are refused unhashed (and charged like any failure)
_CACHE_SECONDS = 300.0  # password hashes are slow on purpose; don't pay per poll


class Authenticator:
    """``check()`` returns the operator's name, or a 401/429 response.

    ``verifier(stored_hash, password)`` checks a password (Werkzeug's
    ``check_password_hash`` unless replaced).
    """

    def __init__(
        self,
        *,
        callback: Callable[[], str | None] | None,
        users: Mapping[str, str],
        storage: Storage,
        keys: KeyBuilder,
        rate: Rate = LOGIN_RATE,
        verifier: Callable[[str, str], bool] = check_password_hash,
    ) -> None:
        self.callback = callback
        self.users = dict(users)
        self.storage = storage
        self.keys = keys
        self.rate = rate
        self.verifier = verifier
        self._fallback = MemoryStorage()
        self._verified: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._dummy = _dummy_hash(next(iter(self.users.values()), None))

    def check(self) -> str | Response:
        if self.callback is not None:
            actor = self.callback()
            return str(actor) if actor else _unauthorized(basic=False)
        if not self.users:
            return _unauthorized(basic=False, detail="The dashboard has no access configured.")
        auth = request.authorization
        if auth is None or auth.type != "basic":
            return _unauthorized()
        username, password = auth.username or "", auth.password or ""
        device = self._device(username)
        budget = self._budget_key(device)
        if self._cached(username, password):
            # Known right: nothing to charge, but a throttled budget still waits,
            # or a guesser could test guesses against this cache without limit.
            if not self._spend(budget, 0):
                return _too_many()
        else:
            if not self._spend(budget, 1):  # charged before checking: no race past the limit
                return _too_many()
            if not self._verify(username, password):
                return _unauthorized()
            self._spend(budget, -1)  # right: refund the charge
        if device is None:
            self._issue_device(username)
        return username

    # -- the password -------------------------------------------------------

    @staticmethod
    def _token(username: str, password: str) -> tuple[str, str]:
        return (username, hashlib.sha256(password.encode("utf-8", "surrogatepass")).hexdigest())

    def _cached(self, username: str, password: str) -> bool:
        with self._lock:
            return self._verified.get(self._token(username, password), 0.0) > time.monotonic()

    def _verify(self, username: str, password: str) -> bool:
        if len(password) > MAX_PASSWORD:
            return False
        stored = self.users.get(username)
        # An unknown user costs the same hash as a known one (against a hash nothing matches).
        matched = self.verifier(stored or self._dummy, password)
        if stored is None or not matched:
            return False
        with self._lock:
            if len(self._verified) > 1000:
                self._verified.clear()
            self._verified[self._token(username, password)] = time.monotonic() + _CACHE_SECONDS
        return True

    # -- the failure budget -------------------------------------------------

    def _budget_key(self, device: str | None) -> str:
        tag = f"dev={device}" if device else KeyBuilder.ip_tag(client_ip(request.remote_addr))
        return f"{self.keys.prefix}:{{{tag}}}:dashlogin"

    def _spend(self, key: str, cost: int) -> bool:
        """Charge (1), refund (-1) or only look at (0) a failure budget; may a check run?

        A refund is a token bucket charge of -1: the exact inverse of a charge,
        and never more than a full bucket (a bucket past full is just full).
        """
        check = Check(key, Algorithm.TOKEN_BUCKET, self.rate, cost)
        for storage in (self.storage, self._fallback):
            try:
                outcome = (storage.decide([check]) if cost else storage.peek([check])).outcomes[0]
            except StorageError:
                continue
            # A look passes while one more failure would still fit.
            return outcome.allowed and (cost != 0 or outcome.remaining > 0)
        return False

    # -- the browser's own budget -------------------------------------------

    def _serializer(self) -> URLSafeTimedSerializer:
        return URLSafeTimedSerializer(current_app.secret_key or "", salt=DEVICE_COOKIE)

    def _device(self, username: str) -> str | None:
        """The id of this browser if it logged in as ``username`` before (signed by us)."""
        raw = request.cookies.get(DEVICE_COOKIE)
        if not raw:
            return None
        try:
            owner, device = self._serializer().loads(raw, max_age=DEVICE_DAYS * 86400)
        except (BadSignature, TypeError, ValueError):
            return None
        ok = owner == username and isinstance(device, str) and device.isalnum()
        return device if ok else None

    def _issue_device(self, username: str) -> None:
        value = self._serializer().dumps([username, secrets.token_hex(16)])
        path = url_for("quota_dashboard.overview_page")

        @after_this_request
        def set_cookie(response: Response) -> Response:
            response.set_cookie(
                DEVICE_COOKIE,
                value,
                max_age=DEVICE_DAYS * 86400,
                path=path,
                secure=request.is_secure,
                httponly=True,
                samesite="Strict",
            )
            return response


def _dummy_hash(model: str | None) -> str:
    """A hash of ``model``'s method (and cost) that no password matches."""
    method = model.split("$", 1)[0] if model else "scrypt"
    return f"{method}${secrets.token_hex(8)}${secrets.token_hex(32)}"


def _unauthorized(*, basic: bool = True, detail: str = "Log in to the dashboard.") -> Response:
    headers = {"WWW-Authenticate": 'Basic realm="flask-quota dashboard", charset="UTF-8"'}
    return Response(detail, 401, headers if basic else {}, content_type="text/plain")


def _too_many() -> Response:
    return Response(
        "Too many failed logins; wait a minute.",
        429,
        {"Retry-After": "60"},
        content_type="text/plain",
    )


def auth_from_config(
    config: Mapping[str, Any], storage: Storage, keys: KeyBuilder
) -> Authenticator:
    """Validate ``QUOTA_DASHBOARD_AUTH`` / ``QUOTA_DASHBOARD_USERS`` into an Authenticator."""
    callback = config.get("QUOTA_DASHBOARD_AUTH")
    if callback is not None and not callable(callback):
        raise ValueError(
            "QUOTA_DASHBOARD_AUTH must be a callable returning the operator's name or None"
        )
    users = config.get("QUOTA_DASHBOARD_USERS") or {}
    if isinstance(users, str):
        try:
            users = json.loads(users)
        except json.JSONDecodeError as exc:
            raise ValueError(f"QUOTA_DASHBOARD_USERS is not valid JSON: {exc}") from None
    if not isinstance(users, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and v.count("$") >= 2 for k, v in users.items()
    ):
        raise ValueError(
            "QUOTA_DASHBOARD_USERS must map user names to Werkzeug password hashes, e.g. "
            "{'ops': werkzeug.security.generate_password_hash('...')}"
        )
    return Authenticator(callback=callback, users=users, storage=storage, keys=keys)
