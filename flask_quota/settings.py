"""``QUOTA_*`` configuration, read once into a frozen, validated object."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar
from urllib.parse import urlsplit

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from .core.algorithms import Algorithm
from .core.calendar import Calendar
from .core.headers import HeaderMode, Renamer, header_names
from .core.plans import DEFAULT_PLANS, PlanCatalog, catalog_from_config
from .core.priority import DEFAULT_RESERVE, Priority, parse_reserve
from .core.rates import ACCEPTED, MAX_WINDOW, Rate, Rates, parse_rate, parse_rates
from .storage.breaker import DEFAULT_THRESHOLD
from .storage.failover import FailMode
from .storage.prefetch import MAX_FRACTION

__all__ = ["DEFAULTS", "DOCS", "FailMode", "HeaderMode", "PlansSource", "Settings", "reference"]

E = TypeVar("E", bound=StrEnum)


class PlansSource(StrEnum):
    """Who owns the plans (``QUOTA_PLANS_SOURCE``)."""

    DATABASE = "database"  # QUOTA_PLANS seeds SQL once; operators edit SQL
    CONFIG = "config"  # QUOTA_PLANS is applied to SQL at every start


DEFAULTS: dict[str, Any] = {
    "QUOTA_STORAGE_URL": "memory://",
    "QUOTA_ALGORITHM": "token_bucket",
    "QUOTA_DEFAULT_PLAN": "free",
    "QUOTA_ANONYMOUS_PLAN": "free",
    "QUOTA_API_KEY_HEADER": "X-API-Key",
    "QUOTA_HEADERS": "both",
    "QUOTA_FAIL_MODE": "open",
    "QUOTA_STORAGE_TIMEOUT": 0.1,
    "QUOTA_DASHBOARD_URL": None,
    "QUOTA_ENABLED": True,
    "QUOTA_PLANS": None,
    "QUOTA_KEY_PREFIX": "quota",
    "QUOTA_UPGRADE_URL": "/pricing",
    "QUOTA_REJECT_UNKNOWN_KEYS": False,
    "QUOTA_BREAKER_COOLDOWN": 1.0,
    "QUOTA_BREAKER_THRESHOLD": DEFAULT_THRESHOLD,  # storage failures in a row that open it
    "QUOTA_DENY_CACHE": True,  # remember Redis denials in-process until their retry time
    "QUOTA_DATABASE_URL": None,  # None: SQLite file in the instance folder (or Quota(db=))
    "QUOTA_SYNC_INTERVAL": 0.5,  # seconds between checks for plan/client changes in SQL
    "QUOTA_EXEMPT_METHODS": "OPTIONS",  # no tier applies to these (CORS preflights)
    "QUOTA_BLOCK_AFTER": None,  # e.g. "20/minute": a caller denied more often is blocked
    "QUOTA_BLOCK_FOR": 600,  # seconds such a block lasts
    "QUOTA_METRICS_URL": None,  # e.g. "/metrics": Prometheus exposition (flask-quota[metrics])
    "QUOTA_SHADOW": False,  # every tier is decided and recorded, nothing is denied
    "QUOTA_PLANS_SOURCE": "database",  # or "config": QUOTA_PLANS is applied to SQL at start
    "QUOTA_STATUS_URL": None,  # e.g. "/rate_limit": the caller's own quota as JSON
    "QUOTA_STATUS_RATE": "60/minute",  # each caller's own budget for QUOTA_STATUS_URL
    "QUOTA_NEAR_LIMIT": 0.8,  # share of a bucket used that fires signals.quota_near_limit
    "QUOTA_TIMEZONE": "UTC",  # N/month and N/year windows follow this zone's calendar
    "QUOTA_LEASE_SECONDS": 60,  # a concurrency lease no one gave back expires after this
    "QUOTA_BILLING_DAY": 1,  # day of the month a N/month quota resets (1-31, clamped)
    "QUOTA_HEADER_NAMES": None,  # e.g. {"X-RateLimit-Limit": "X-Quota-Limit"}: renames ours
    "QUOTA_PREFETCH": None,  # e.g. 0.05: a worker may take up to 5% of a bucket ahead, spend
    # it locally, and ask storage again only when its share runs out
    "QUOTA_PRIORITY": None,  # callable() -> "critical" | "default" | "sheddable"
    "QUOTA_CAPACITY": None,  # e.g. 64: requests in flight at once across every server
    "QUOTA_RESERVE": DEFAULT_RESERVE,  # share of the capacity only higher classes may use
    "QUOTA_ADAPTIVE": False,  # True: each worker's capacity follows measured latency
    "QUOTA_MAX_QUEUE_MS": None,  # e.g. 2000: shed a non-critical request queued longer
    "QUOTA_ALERTS": (0.5, 0.8, 1.0),  # shares of a calendar quota told once per period
    "QUOTA_LEDGER": False,  # True: admitted units per caller, tenant, resource and day in SQL
    "QUOTA_WEBHOOK_URL": None,  # POST each event (quota.alert, ...) as JSON here
    "QUOTA_WEBHOOK_SECRET": None,  # signs the events: the Quota-Signature header
}

# What each key means: the configuration reference (README, docs and init_app's
# docstring) is generated from this table, and a test keeps it in step with DEFAULTS.
DOCS: dict[str, str] = {
    "QUOTA_STORAGE_URL": "Where counters live: ``memory://``, ``redis://host:6379/0``, "
    "``rediss://...``, ``unix:///path/redis.sock``, ``redis+sentinel://host:26379/service`` "
    "or ``redis+cluster://host:6379[,host:6380]``; ``valkey://``, ``valkeys://``, "
    "``valkey+sentinel://`` and ``valkey+cluster://`` mean the same for Valkey. "
    "Percent-encode ``/ ? # @`` in a password (``%2F %3F %23 %40``).",
    "QUOTA_ALGORITHM": "``token_bucket``, ``fixed_window``, ``sliding_window_log`` or "
    "``sliding_window_counter``.",
    "QUOTA_DEFAULT_PLAN": "Plan of identities that name none.",
    "QUOTA_ANONYMOUS_PLAN": "Plan of requests without an identity (keyed by IP).",
    "QUOTA_API_KEY_HEADER": "Request header carrying a client's API key.",
    "QUOTA_HEADERS": "Rate-limit headers to send: ``legacy`` (``X-RateLimit-*``), ``ietf`` "
    "(``RateLimit``/``RateLimit-Policy``), ``both`` or ``none``.",
    "QUOTA_FAIL_MODE": "When the storage fails: ``open`` (no limits), ``closed`` (503 with "
    "``Retry-After``) or ``local`` (an in-process limiter per worker).",
    "QUOTA_STORAGE_TIMEOUT": "Seconds before a storage call counts as failed.",
    "QUOTA_DASHBOARD_URL": "URL prefix to mount the dashboard at, e.g. ``/quota``; ``None``: "
    "not mounted.",
    "QUOTA_ENABLED": "``False`` switches enforcement off entirely.",
    "QUOTA_PLANS": "Plans as a dict (or JSON): ``{name: {global, tenant, user, concurrent, "
    "resources, description, upgrade}}``, each resource a rate or ``{rate, algorithm, shadow, "
    "unit}``; ``None``: the built-in free/pro/enterprise plans.",
    "QUOTA_KEY_PREFIX": "Prefix of every storage key.",
    "QUOTA_UPGRADE_URL": "Link named in the ``upgrade`` hint of a 429 body.",
    "QUOTA_REJECT_UNKNOWN_KEYS": "Answer 401 to an unknown, revoked or malformed API key "
    "instead of treating the caller as anonymous.",
    "QUOTA_BREAKER_COOLDOWN": "Seconds between probes of a failed storage.",
    "QUOTA_BREAKER_THRESHOLD": "Storage failures in a row that open the circuit breaker "
    "(calls that fail together count once); a failure before that applies the fail mode to "
    "its own request only.",
    "QUOTA_DENY_CACHE": "Answer repeated denials in-process until their retry time (Redis "
    "backends), keeping a flood off Redis. For the storage built from "
    "``QUOTA_STORAGE_URL``: set with ``Quota(app, storage=...)`` it is refused.",
    "QUOTA_DATABASE_URL": "SQLAlchemy URL of the quota tables; ``None``: a SQLite file in the "
    "instance folder, or the app's database with ``Quota(app, db=db)``.",
    "QUOTA_SYNC_INTERVAL": "Seconds between checks for plan and client changes in SQL (at "
    "most 1.5, so a change reaches every worker within 2 s).",
}

DOCS["QUOTA_EXEMPT_METHODS"] = (
    "HTTP methods no tier applies to (comma-separated or a list); CORS preflights by default."
)

DOCS["QUOTA_BLOCK_AFTER"] = (
    "A rate such as ``20/minute``: a caller denied more often than this is blocked; "
    "``None``: never."
)
DOCS["QUOTA_BLOCK_FOR"] = "Seconds a block by ``QUOTA_BLOCK_AFTER`` lasts."
DOCS["QUOTA_LEASE_SECONDS"] = (
    "Seconds a concurrency lease (``concurrent=``) lives at most, on the storage's clock: "
    "one a killed worker never gave back frees its slot after this. Longer than your "
    "slowest request, or a request still running loses its slot."
)
DOCS["QUOTA_METRICS_URL"] = (
    "Path to serve Prometheus metrics at, e.g. ``/metrics`` (exempt from limits; needs "
    "``pip install 'flask-quota[metrics]'``); ``None``: no metrics. Several gunicorn workers "
    "need ``PROMETHEUS_MULTIPROC_DIR``: see Operations."
)
DOCS["QUOTA_SHADOW"] = (
    "Shadow mode for every tier: each is decided and recorded (``shadow_denied`` in usage, "
    "``signals.quota_shadow_exceeded``), nothing is denied. A plan limit can also be shadow "
    "on its own (its ``shadow`` flag)."
)
DOCS["QUOTA_PLANS_SOURCE"] = (
    "Who owns the plans: ``database`` (``QUOTA_PLANS`` seeds the SQL tables once, then SQL "
    "is the truth and a start-up warning names every difference from ``QUOTA_PLANS``) or "
    "``config`` (``QUOTA_PLANS`` is applied to SQL at every start, audited; plans are "
    "read-only on the dashboard and in the CLI). Clients and overrides are never touched."
)

DOCS["QUOTA_STATUS_URL"] = (
    "Path of the caller's own quota, e.g. ``/rate_limit``: ``GET`` answers the calling API "
    "key or identity (else IP) with its plan, tenant and every bucket that applies to it, "
    "as JSON, charging only the ``global`` tier and its own budget (``QUOTA_STATUS_RATE``); "
    "``None``: not served."
)
DOCS["QUOTA_STATUS_RATE"] = (
    "Each caller's own budget for ``QUOTA_STATUS_URL`` (per API key or identity, else IP), "
    "decided with the ``global`` tier in the status call's one storage call; a plan's "
    "``quota_status`` resource wins over it. Bounds what one caller's status reads cost "
    "the storage (past it the deny cache answers)."
)
DOCS["QUOTA_NEAR_LIMIT"] = (
    "Share of a bucket (between 0 and 1) whose crossing fires ``signals.quota_near_limit`` "
    "once and counts ``flask_quota_near_limit_total``; the dashboard's \"about to hit the "
    'limit" list uses it too. ``None``: no warning.'
)
DOCS["QUOTA_PREFETCH"] = (
    "Share of a bucket (above 0, at most 0.5) a worker may take ahead and spend in-process, "
    "asking the storage again only when it runs out; ``None``: every request is decided in "
    "storage. Never admits more than the exact limit (a reset made on another server aside); "
    "token buckets and fixed windows only "
    "(sliding windows, shadow checks and concurrency leases are always decided in "
    'storage); headers become approximate. See Operations, "Prefetch".'
)
DOCS["QUOTA_TIMEZONE"] = (
    "IANA time zone (``zoneinfo``) whose calendar ``N/month`` and ``N/year`` rates follow: "
    "their windows start at local midnight, DST changes included."
)
DOCS["QUOTA_BILLING_DAY"] = (
    "Day of the month (1-31) a ``N/month`` quota resets on, at 00:00 in "
    "``QUOTA_TIMEZONE``; a day past the month's end means its last day (31: April 30). "
    "Years start on January 1."
)
DOCS["QUOTA_HEADER_NAMES"] = (
    'Our headers under other names, as a dict (or JSON): ``{"X-RateLimit-Limit": '
    '"X-Quota-Limit"}``. Any of ``X-RateLimit-Limit``, ``-Remaining``, ``-Reset``, '
    "``-Resource``, ``RateLimit``, ``RateLimit-Policy`` and ``Retry-After`` (on 429 and "
    "503 too); the old name is not sent. ``None``: the usual names."
)

DOCS["QUOTA_PRIORITY"] = (
    "A callable asked on every request, returning its class: ``critical``, ``default`` or "
    "``sheddable``; it wins over a route's ``priority=`` (``None``: the route's, else "
    "``default``). Asked only when ``QUOTA_CAPACITY``, ``QUOTA_ADAPTIVE`` or "
    "``QUOTA_MAX_QUEUE_MS`` is set."
)
DOCS["QUOTA_CAPACITY"] = (
    "Requests in flight at once across every worker of every server sharing the storage, "
    "checked in the request's one storage call (``None``: no limit). Past it (less the "
    'reserves) a request is shed: 503, ``"tier": "capacity"``. With '
    "``QUOTA_ADAPTIVE`` it also caps each worker's adaptive capacity."
)
DOCS["QUOTA_RESERVE"] = (
    "Share of the capacity each class leaves to the classes above it, as a dict (or JSON): "
    '``{"critical": 0.2, "default": 0.1}`` admits sheddable requests up to 70% of '
    "it, default ones up to 90%, critical ones up to all of it."
)
DOCS["QUOTA_ADAPTIVE"] = (
    "``True``: each worker limits its own requests in flight to a capacity that follows "
    "the latency it measures (a gradient on the no-load time, see Overload protection), "
    "shed by class with ``QUOTA_RESERVE``; ``QUOTA_CAPACITY``, if set, caps it."
)
DOCS["QUOTA_MAX_QUEUE_MS"] = (
    "Shed a non-critical request that waited longer than this many milliseconds before "
    "reaching the app, by the ``X-Request-Start`` header its proxy wrote (``t=<seconds."
    'fraction>``, ``t=<microseconds>`` or ``<milliseconds>``): 503, ``"tier": '
    '"queue"``. Set it only behind a proxy that writes (overwrites) the header. ``None``: '
    "the header is never read."
)

DOCS["QUOTA_ALERTS"] = (
    "Shares of a calendar quota (``N/month``, ``N/year``; above 0, at most 1) whose "
    "crossing sends ``signals.quota_alert``, counts ``flask_quota_alerts`` and, with "
    "``QUOTA_WEBHOOK_URL``, a ``quota.alert`` event: once per bucket, share and period "
    "across every server (claimed in the storage). A list, or text such as ``0.8,1``; "
    "``None`` or ``()``: no alerts."
)
DOCS["QUOTA_LEDGER"] = (
    "``True``: every admitted unit is recorded per day (in ``QUOTA_TIMEZONE``), caller "
    "(the client, else the identity), tenant and resource in the ``quota_usage`` table, "
    "with the requests admitted and denied; written by each worker every "
    "``QUOTA_SYNC_INTERVAL``, never in a request. See Usage and billing."
)
DOCS["QUOTA_WEBHOOK_URL"] = (
    "An ``http(s)://`` URL each event (``quota.alert``, ``quota.exceeded``, "
    "``caller.blocked``) is POSTed to as JSON, from the ``quota_webhook_events`` outbox by a "
    "background sender, retried for 24 h; needs ``QUOTA_WEBHOOK_SECRET``. ``None``: no "
    "events are kept. See Webhooks."
)
DOCS["QUOTA_WEBHOOK_SECRET"] = (
    "The secret the events are signed with: ``Quota-Signature: t=<unix time>,v1=<hex "
    "HMAC-SHA256 of '<t>.<body>'>``. At least 16 characters; keep it out of the code."
)

# Read by the dashboard when it is mounted (dashboard/auth.py), not by Settings.
DASHBOARD_DOCS: dict[str, str] = {
    "QUOTA_DASHBOARD_USERS": "Dashboard logins: ``{user: werkzeug password hash}`` (or JSON).",
    "QUOTA_DASHBOARD_AUTH": "A callable returning the operator's name, or ``None`` to refuse; "
    "wins over ``QUOTA_DASHBOARD_USERS``.",
}


def reference() -> list[tuple[str, str, str]]:
    """``(key, default, meaning)`` for every configuration key, in documentation order."""
    rows = [(key, repr(DEFAULTS[key]), DOCS[key]) for key in DEFAULTS]
    return rows + [(key, "None", doc) for key, doc in DASHBOARD_DOCS.items()]


# A change must reach every worker within 2 s: poll interval + reload time.
_MAX_SYNC_INTERVAL = 1.5

_METHOD_RE = re.compile(r"[A-Z]{1,20}")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Settings:
    storage_url: str
    algorithm: Algorithm
    default_plan: str
    anonymous_plan: str
    api_key_header: str
    headers: HeaderMode
    fail_mode: FailMode
    storage_timeout: float
    dashboard_url: str | None
    enabled: bool
    plans: PlanCatalog
    key_prefix: str
    upgrade_url: str
    reject_unknown_keys: bool
    breaker_cooldown: float
    breaker_threshold: int
    deny_cache: bool
    database_url: str | None
    sync_interval: float
    exempt_methods: frozenset[str]
    block_after: Rate | None = None
    block_for: int = 600
    metrics_url: str | None = None
    shadow: bool = False
    plans_source: PlansSource = PlansSource.DATABASE
    plans_configured: bool = False  # QUOTA_PLANS was given (not the built-in plans)
    status_url: str | None = None
    status_rate: Rates = field(default_factory=lambda: parse_rates("60/minute"))
    near_limit: float | None = 0.8
    calendar: Calendar = field(default_factory=Calendar)  # QUOTA_TIMEZONE, QUOTA_BILLING_DAY
    renamer: Renamer | None = None  # QUOTA_HEADER_NAMES; None: the usual names
    lease_seconds: int = 60
    prefetch: float | None = None  # QUOTA_PREFETCH: the largest share of a bucket taken ahead
    priority: Callable[[], Any] | None = None  # QUOTA_PRIORITY: a request's class
    capacity: int | None = None  # QUOTA_CAPACITY: the fleet's requests in flight at most
    reserve: Mapping[Priority, float] = field(
        default_factory=lambda: parse_reserve(DEFAULT_RESERVE)
    )  # QUOTA_RESERVE
    adaptive: bool = False  # QUOTA_ADAPTIVE
    max_queue_ms: float | None = None  # QUOTA_MAX_QUEUE_MS
    alerts: tuple[float, ...] = ()  # QUOTA_ALERTS, ascending
    ledger: bool = False  # QUOTA_LEDGER
    webhook_url: str | None = None  # QUOTA_WEBHOOK_URL
    webhook_secret: str | None = None  # QUOTA_WEBHOOK_SECRET

    @property
    def overload(self) -> bool:
        """True when any overload protection is on: then requests have a class."""
        return self.capacity is not None or self.adaptive or self.max_queue_ms is not None

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Settings:
        """Validate every key; a bad value raises ``ValueError`` naming the key and the fix.

        Values may be strings (as they come from environment variables).
        """
        get = {key: config.get(key, default) for key, default in DEFAULTS.items()}
        upgrade_url = _text(get, "QUOTA_UPGRADE_URL")
        raw_plans = get["QUOTA_PLANS"]
        if isinstance(raw_plans, str):
            try:
                raw_plans = json.loads(raw_plans)
            except json.JSONDecodeError as exc:
                raise ValueError(f"QUOTA_PLANS is not valid JSON: {exc}") from None
        algorithm = _choice(get, "QUOTA_ALGORITHM", Algorithm)
        # The app's own plans must fit QUOTA_ALGORITHM; the built-in ones are not the
        # app's to edit, so a limit of theirs too large for a sliding log is enforced on
        # a sliding counter instead (Policy logs it once).
        plans = catalog_from_config(
            raw_plans or DEFAULT_PLANS,
            upgrade_url=upgrade_url,
            algorithm=algorithm if raw_plans else None,
        )
        settings = cls(
            storage_url=_text(get, "QUOTA_STORAGE_URL"),
            algorithm=algorithm,
            default_plan=_text(get, "QUOTA_DEFAULT_PLAN"),
            anonymous_plan=_text(get, "QUOTA_ANONYMOUS_PLAN"),
            api_key_header=_text(get, "QUOTA_API_KEY_HEADER"),
            headers=_choice(get, "QUOTA_HEADERS", HeaderMode),
            fail_mode=_choice(get, "QUOTA_FAIL_MODE", FailMode),
            storage_timeout=_positive(get, "QUOTA_STORAGE_TIMEOUT"),
            dashboard_url=get["QUOTA_DASHBOARD_URL"] or None,
            enabled=_flag(get, "QUOTA_ENABLED"),
            plans=plans,
            key_prefix=_text(get, "QUOTA_KEY_PREFIX"),
            upgrade_url=upgrade_url,
            reject_unknown_keys=_flag(get, "QUOTA_REJECT_UNKNOWN_KEYS"),
            breaker_cooldown=_positive(get, "QUOTA_BREAKER_COOLDOWN"),
            breaker_threshold=_failures(get, "QUOTA_BREAKER_THRESHOLD"),
            deny_cache=_flag(get, "QUOTA_DENY_CACHE"),
            database_url=_database_url(get, "QUOTA_DATABASE_URL"),
            sync_interval=_positive(get, "QUOTA_SYNC_INTERVAL"),
            exempt_methods=_methods(get, "QUOTA_EXEMPT_METHODS"),
            block_after=_block_after(get, "QUOTA_BLOCK_AFTER"),
            block_for=_whole_seconds(get, "QUOTA_BLOCK_FOR"),
            lease_seconds=_lease_seconds(get, "QUOTA_LEASE_SECONDS"),
            metrics_url=_path(get, "QUOTA_METRICS_URL", "/metrics"),
            shadow=_flag(get, "QUOTA_SHADOW"),
            plans_source=_choice(get, "QUOTA_PLANS_SOURCE", PlansSource),
            plans_configured=bool(raw_plans),
            status_url=_path(get, "QUOTA_STATUS_URL", "/rate_limit"),
            status_rate=_rates(get, "QUOTA_STATUS_RATE"),
            near_limit=_share(get, "QUOTA_NEAR_LIMIT"),
            calendar=_calendar(get),
            renamer=_renamer(get, "QUOTA_HEADER_NAMES"),
            prefetch=_prefetch(get, "QUOTA_PREFETCH"),
            priority=_callable(get, "QUOTA_PRIORITY"),
            capacity=_capacity(get, "QUOTA_CAPACITY"),
            reserve=parse_reserve(get["QUOTA_RESERVE"]),
            adaptive=_flag(get, "QUOTA_ADAPTIVE"),
            max_queue_ms=_milliseconds(get, "QUOTA_MAX_QUEUE_MS"),
            alerts=_alerts(get, "QUOTA_ALERTS"),
            ledger=_flag(get, "QUOTA_LEDGER"),
            webhook_url=_webhook_url(get, "QUOTA_WEBHOOK_URL"),
            webhook_secret=_secret(get, "QUOTA_WEBHOOK_SECRET"),
        )
        for key in ("QUOTA_DEFAULT_PLAN", "QUOTA_ANONYMOUS_PLAN"):
            if get[key] not in plans:
                raise ValueError(f"{key}={get[key]!r} is not a plan; known plans: {list(plans)}")
        if settings.sync_interval > _MAX_SYNC_INTERVAL:
            raise ValueError(
                f"QUOTA_SYNC_INTERVAL={get['QUOTA_SYNC_INTERVAL']!r} is too long: changes must "
                f"reach every worker within 2 s; use at most {_MAX_SYNC_INTERVAL} seconds"
            )
        if settings.webhook_url is not None and settings.webhook_secret is None:
            raise ValueError(
                "QUOTA_WEBHOOK_URL needs QUOTA_WEBHOOK_SECRET: receivers verify each event's "
                "Quota-Signature with it (e.g. QUOTA_WEBHOOK_SECRET = secrets.token_hex(32))"
            )
        if settings.dashboard_url is not None and not str(settings.dashboard_url).startswith("/"):
            raise ValueError("QUOTA_DASHBOARD_URL must be a path starting with '/', e.g. '/quota'")
        return settings


def _calendar(get: dict[str, Any]) -> Calendar:
    """QUOTA_TIMEZONE and QUOTA_BILLING_DAY (an int, or digits from the environment)."""
    zone, day = get["QUOTA_TIMEZONE"], get["QUOTA_BILLING_DAY"]
    text = day.strip() if isinstance(day, str) else None
    if text is not None and text.isascii() and text.isdigit() and len(text) <= 2:
        day = int(text)
    if isinstance(day, bool) or not isinstance(day, int) or not 1 <= day <= 31:
        raise ValueError(
            f"QUOTA_BILLING_DAY={day!r} must be a day of the month from 1 to 31 "
            "(29-31 mean the month's last day in shorter months)"
        )
    if not isinstance(zone, str) or not zone.strip():
        raise ValueError(f"QUOTA_TIMEZONE must be an IANA time zone such as 'UTC', got {zone!r}")
    try:
        return Calendar(zone.strip(), day)
    except ValueError as exc:
        raise ValueError(f"QUOTA_TIMEZONE: {exc}") from None


def _renamer(get: dict[str, Any], key: str) -> Renamer | None:
    names = header_names(get[key], key)
    return Renamer(names) if names else None


def _text(get: dict[str, Any], key: str) -> str:
    value = get[key]
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{key} must be a non-empty string, got {value!r}")
    return value.strip()


def _path(get: dict[str, Any], key: str, example: str) -> str | None:
    """A URL path starting with ``/``, or ``None`` (also for ``""``) when unset."""
    value = get[key]
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.startswith("/") or value != value.strip():
        raise ValueError(f"{key}={value!r} must be a path starting with '/', e.g. {example!r}")
    return value


def _choice(get: dict[str, Any], key: str, enum: type[E]) -> E:
    value = get[key]
    try:
        return enum(str(value).strip().lower())
    except ValueError:
        choices = ", ".join(repr(member.value) for member in enum)
        raise ValueError(f"{key}={value!r} is not valid; choose one of {choices}") from None


def _flag(get: dict[str, Any], key: str) -> bool:
    value = get[key]
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise ValueError(f"{key}={value!r} is not a boolean; use true or false")


def _methods(get: dict[str, Any], key: str) -> frozenset[str]:
    """HTTP methods as a comma-separated string or a list; ``""`` or ``[]`` for none."""
    value = get[key]
    if isinstance(value, str):
        items: list[Any] = value.split(",")
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(value)
    else:
        items = [value]
    methods = set()
    for item in items:
        method = item.strip().upper() if isinstance(item, str) else None
        if method == "" and isinstance(value, str):
            continue  # "" or a trailing comma
        if method is None or not _METHOD_RE.fullmatch(method):
            raise ValueError(
                f"{key}={value!r} is not a list of HTTP methods; use e.g. 'OPTIONS' or "
                "'OPTIONS, HEAD'"
            )
        methods.add(method)
    return frozenset(methods)


def _positive(get: dict[str, Any], key: str) -> float:
    value = get[key]
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond any float
        number = float("nan")
    if not number > 0 or number == float("inf") or isinstance(value, bool):
        raise ValueError(f"{key}={value!r} must be a positive number of seconds")
    return number


def _fraction(get: dict[str, Any], key: str) -> float | None:
    """``get[key]`` as a number (NaN when it is none, a bool included), or ``None``
    when it is off (``None``, ``""``, ``"none"``, ``"off"``): the caller checks the range."""
    value = get[key]
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "off")):
        return None
    if isinstance(value, bool):
        return float("nan")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return float("nan")


def _share(get: dict[str, Any], key: str) -> float | None:
    """A share strictly between 0 and 1 (a number, or its text), or ``None`` when off."""
    share = _fraction(get, key)
    if share is not None and not 0 < share < 1:
        raise ValueError(
            f"{key}={get[key]!r} must be a share of a bucket between 0 and 1 (exclusive), e.g. "
            "0.8, or None to send no near-limit warning"
        )
    return share


def _prefetch(get: dict[str, Any], key: str) -> float | None:
    """A share above 0 and at most ``MAX_FRACTION`` (a number, or its text), or ``None``."""
    share = _fraction(get, key)
    if share is not None and not 0 < share <= MAX_FRACTION:
        raise ValueError(
            f"{key}={get[key]!r} must be the share of a bucket a worker may take ahead, above 0 "
            f"and at most {MAX_FRACTION}, e.g. 0.05; or None to decide every request in storage"
        )
    return share


def _block_after(get: dict[str, Any], key: str) -> Rate | None:
    value = get[key]
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "off")):
        return None
    try:
        rate = parse_rate(value)
    except ValueError:
        raise ValueError(
            f"{key}={value!r} is not a rate; use e.g. '20/minute' (a caller denied more often "
            f"is blocked for QUOTA_BLOCK_FOR seconds) or None to never block; rates: {ACCEPTED}"
        ) from None
    if rate.calendar is not None:
        # Denials are counted in a rolling window; a calendar month would forgive them all
        # at once at its end.
        raise ValueError(
            f"{key}={value!r}: denials are counted over seconds to days, not a calendar "
            f"{rate.calendar}; use e.g. '20/minute' or '500/day'"
        )
    return rate


def _callable(get: dict[str, Any], key: str) -> Callable[[], Any] | None:
    value = get[key]
    if value is None:
        return None
    if not callable(value):
        raise ValueError(f"{key} must be a callable returning a request's class, got {value!r}")
    return value  # type: ignore[no-any-return]


def _capacity(get: dict[str, Any], key: str) -> int | None:
    """A whole number of requests in flight, at least 1 (or digits), or ``None``."""
    value = get[key]
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    text = value.strip() if isinstance(value, str) else None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif text is not None and text.isascii() and text.isdigit() and len(text) <= 9:
        number = int(text)
    else:
        number = 0
    if not 1 <= number <= 1_000_000:
        raise ValueError(
            f"{key}={value!r} must be a whole number of requests in flight at once across the "
            "fleet, from 1 to 1,000,000 (e.g. 64), or None"
        )
    return number


def _alerts(get: dict[str, Any], key: str) -> tuple[float, ...]:
    """Shares above 0 and at most 1, as a list or as text (``"0.8,1"``); ``None``: none."""
    value = get[key]
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    fault = (
        f"{key}={value!r} must be shares of a calendar quota above 0 and at most 1, e.g. "
        "(0.5, 0.8, 1.0) or '0.8,1', or None for no alerts"
    )
    if isinstance(items, (int, float)) or not hasattr(items, "__iter__"):
        raise ValueError(fault)
    shares = set()
    for item in items:
        text = item.strip() if isinstance(item, str) else item
        if text == "":
            continue
        try:
            share = float(text)
        except (TypeError, ValueError):
            raise ValueError(fault) from None
        if isinstance(text, bool) or not 0 < share <= 1:
            raise ValueError(fault)
        shares.add(share)
    return tuple(sorted(shares))


def _webhook_url(get: dict[str, Any], key: str) -> str | None:
    """An absolute ``http://`` or ``https://`` URL with a host, or ``None``."""
    value = get[key]
    if value is None or value == "":
        return None
    parts = urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(
            f"{key}={value!r} must be an http:// or https:// URL, e.g. "
            "'https://billing.example.com/hooks/quota', or None"
        )
    return str(value)


def _secret(get: dict[str, Any], key: str) -> str | None:
    value = get[key]
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) < 16:
        raise ValueError(
            f"{key} must be a string of at least 16 characters (e.g. secrets.token_hex(32)); "
            "the value given is not shown"
        )
    return value


def _milliseconds(get: dict[str, Any], key: str) -> float | None:
    number = _fraction(get, key)
    if number is not None and not 0 < number < 3_600_000:
        raise ValueError(
            f"{key}={get[key]!r} must be a number of milliseconds above 0 (e.g. 2000), or None"
        )
    return number


def _rates(get: dict[str, Any], key: str) -> Rates:
    """One rate or several, comma-separated (``"60/minute, 1000/day"``)."""
    value = get[key]
    try:
        return parse_rates(value)
    except (ValueError, TypeError):
        raise ValueError(
            f"{key}={value!r} is not a rate; use e.g. '60/minute'; {ACCEPTED}"
        ) from None


def _whole_seconds(get: dict[str, Any], key: str) -> int:
    value = get[key]
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) <= 0:
        raise ValueError(f"{key}={value!r} must be a whole number of seconds above 0, e.g. 600")
    return int(text)


def _lease_seconds(get: dict[str, Any], key: str) -> int:
    """Whole seconds, 1 to 366 days: a lease is stored like a rate's window."""
    seconds = _whole_seconds(get, key)
    if seconds > MAX_WINDOW:
        raise ValueError(f"{key}={seconds} is longer than 366 days; e.g. 60 (one minute)")
    return seconds


def _failures(get: dict[str, Any], key: str) -> int:
    """A whole number of failures, at least 1 (an int, or digits from the environment)."""
    value = get[key]
    text = value.strip() if isinstance(value, str) else None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif text is not None and text.isascii() and text.isdigit() and len(text) <= 9:
        number = int(text)
    else:
        number = 0
    if number < 1:
        raise ValueError(
            f"{key}={value!r} must be a whole number of storage failures in a row, at least 1 "
            "(1 opens the circuit breaker on the first failure)"
        )
    return number


def _database_url(get: dict[str, Any], key: str) -> str | None:
    """A SQLAlchemy URL whose dialect is installed, or ``None`` for the default.

    Messages never echo the URL's password.
    """
    value = get[key]
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    hint = "e.g. sqlite:////var/lib/app/quota.sqlite3 or postgresql+psycopg2://user@host/db"
    try:
        url = make_url(str(value).strip())
    except (ArgumentError, ValueError):
        raise ValueError(f"{key} is not a SQLAlchemy database URL; {hint}") from None
    shown = url.render_as_string(hide_password=True)
    try:
        url.get_dialect().import_dbapi()  # a missing driver fails here, not at first request
    except (NoSuchModuleError, ArgumentError, ImportError) as exc:
        raise ValueError(
            f"{key}={shown!r} names a database driver that is not installed ({exc}); "
            f"install it or name an installed one, {hint}"
        ) from None
    return str(value).strip()
