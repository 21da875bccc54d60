"""Who may open the dashboard: a host callable or HTTP Basic with Werkzeug hashes.

Failed Basic logins are themselves rate limited per IP, through the quota
storage when it answers (shared by all workers) and in-process otherwise.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from flask import Response, request
from werkzeug.security import check_password_hash

from flask_quota.algorithms import Algorithm
from flask_quota.identity import client_ip
from flask_quota.keys import KeyBuilder
from flask_quota.rates import Rate, parse_rate
from flask_quota.storage import Check, MemoryStorage, Storage, StorageError

__all__ = ["LOGIN_RATE", "Authenticator", "auth_from_config"]

LOGIN_RATE = parse_rate("10/minute")
_CACHE_SECONDS = 300.0  # password hashes are slow on purpose; don't pay per poll


class Authenticator:
    """``check()`` returns the operator's name, or a 401/429 response."""

    def __init__(
        self,
        *,
        callback: Callable[[], str | None] | None,
        users: Mapping[str, str],
        storage: Storage,
        keys: KeyBuilder,
        rate: Rate = LOGIN_RATE,
    ) -> None:
        self.callback = callback
        self.users = dict(users)
        self.storage = storage
        self.keys = keys
        self.rate = rate
        self._fallback = MemoryStorage()
        self._verified: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    @property
    def configured(self) -> bool:
        return self.callback is not None or bool(self.users)

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
        if self._cached(username, password):
            return username
        if not self._attempt_check(cost=0):
            return _too_many()
        if self._verify(username, password):
            return username
        self._attempt_check(cost=1)
        return _unauthorized()

    @staticmethod
    def _token(username: str, password: str) -> tuple[str, str]:
        return (username, hashlib.sha256(password.encode("utf-8", "surrogatepass")).hexdigest())

    def _cached(self, username: str, password: str) -> bool:
        with self._lock:
            return self._verified.get(self._token(username, password), 0.0) > time.monotonic()

    def _verify(self, username: str, password: str) -> bool:
        stored = self.users.get(username)
        if stored is None or len(password) > 1024 or not check_password_hash(stored, password):
            return False
        with self._lock:
            if len(self._verified) > 1000:
                self._verified.clear()
            self._verified[self._token(username, password)] = time.monotonic() + _CACHE_SECONDS
        return True

    def _attempt_check(self, cost: int) -> bool:
        """Peek (cost 0) or charge (cost 1) the failed-login budget of this IP."""
        tag = KeyBuilder.ip_tag(client_ip(request.remote_addr))
        check = Check(
            f"{self.keys.prefix}:{{{tag}}}:dashlogin", Algorithm.TOKEN_BUCKET, self.rate, cost
        )
        for storage in (self.storage, self._fallback):
            try:
                verdict = storage.decide([check]) if cost else storage.peek([check])
                outcome = verdict.outcomes[0]
            except StorageError:
                continue
            # A peek passes while one more failure would still fit.
            return outcome.allowed and (cost > 0 or outcome.remaining > 0)
        return False


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
        import json

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
