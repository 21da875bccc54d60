"""The SQL tables behind plans, clients, overrides, networks and the audit log (``quota_*``).

The models use their own declarative base and ``MetaData`` rather than the
host's ``db.Model``: an extension cannot know the host's ``db`` at import time.
``Quota(app, db=db)`` copies these tables into ``db.metadata`` (``copy_tables``)
so that ``db.create_all()`` and ``flask db migrate`` see them. Every constraint
has a fixed name so that migrations match on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Date,
    DateTime,
    Dialect,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship, validates

from ..core import validators
from ..core.tiers import RATE_TIERS

__all__ = [
    "SCHEMA_REVISION",
    "AuditEntry",
    "Client",
    "CreditBalance",
    "CreditGrant",
    "LedgerFlush",
    "Model",
    "NetworkRecord",
    "Override",
    "PlanLimit",
    "PlanRecord",
    "QuotaMeta",
    "UTCDateTime",
    "UsageRow",
    "WebhookEvent",
    "copy_tables",
    "metadata",
    "utcnow",
]

# The Alembic revision these models correspond to (migrations/versions/). When the
# extension creates the tables itself, it records this revision so that a later
# ``flask db upgrade`` continues from here; tests/test_migrations.py keeps it in step.
SCHEMA_REVISION = "0006_credits"

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

_TIERS = ", ".join(f"'{tier.value}'" for tier in RATE_TIERS)
# Endpoint rows name a resource, global and user rows do not ('' rather than NULL,
# so that the unique constraints hold on every database).
_RESOURCE_CHECK = "(tier = 'endpoint' AND resource <> '') OR (tier <> 'endpoint' AND resource = '')"
# An override is a client's or a tenant's, never both nor neither.
_TARGET_CHECK = (
    "(client_id IS NOT NULL AND tenant IS NULL) OR (client_id IS NULL AND tenant IS NOT NULL)"
)


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("UTCDateTime needs a timezone-aware datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Model(DeclarativeBase):
    """The declarative base of the quota tables (their own ``metadata``)."""

    metadata = metadata


def copy_tables(target: MetaData) -> None:
    """Add the quota tables to a host's ``MetaData``, for its ``create_all()`` and autogenerate.

    The copies carry plain SQLAlchemy types (``UTCDateTime`` becomes
    ``DateTime(timezone=True)``): a migration Alembic autogenerates from them
    imports nothing of ours and runs as generated. Reads and writes go through
    our own tables, whose ``UTCDateTime`` keeps datetimes aware and in UTC.
    """
    for table in metadata.sorted_tables:
        if table.name in target.tables:
            continue
        copy = table.to_metadata(target)
        for column in copy.columns:
            if isinstance(column.type, UTCDateTime):
                column.type = DateTime(timezone=True)


def _tier(value: str) -> str:
    return validators.tier_name(value).value


def _resource_for(tier: str, resource: str) -> str:
    """Endpoint rows name a resource; global and user rows use ``''``."""
    return validators.tier_resource(tier, resource)[1]


class PlanRecord(Model):
    """A plan: the rates its callers get, in upgrade order (``position``), and how many
    requests of one caller may be in flight at once (``concurrent``; None: no bound)."""

    __tablename__ = "quota_plans"
    # Table-level (not ``unique=True``): copies in a host's metadata keep the name.
    __table_args__ = (
        UniqueConstraint("name"),
        CheckConstraint("concurrent >= 1", name="concurrent"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text, default="")
    upgrade_hint: Mapped[str | None] = mapped_column(Text)  # None: generated from later plans
    position: Mapped[int] = mapped_column(Integer, default=0)  # cheapest first
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    concurrent: Mapped[int | None] = mapped_column(Integer)

    limits: Mapped[list[PlanLimit]] = relationship(
        back_populates="plan", cascade="all, delete-orphan", order_by="PlanLimit.id"
    )

    @validates("name")
    def _check_name(self, key: str, value: str) -> str:
        return validators.plan_name(value)

    @validates("concurrent")
    def _check_concurrent(self, key: str, value: int | None) -> int | None:
        return None if value is None else validators.concurrency(value)


class _TierRate:
    """A rate for a tier (and, for the endpoint tier, a resource): validated on write."""

    tier: Mapped[str] = mapped_column(String(16))
    resource: Mapped[str] = mapped_column(String(64), default="")  # '' for global and user
    rate: Mapped[str] = mapped_column(String(100))  # canonical text, e.g. "100/minute"

    @validates("tier")
    def _check_tier(self, key: str, value: str) -> str:
        tier = _tier(value)
        if self.resource is not None:
            _resource_for(tier, self.resource)
        return tier

    @validates("rate")
    def _check_rate(self, key: str, value: str) -> str:
        return validators.rate_text(value)

    @validates("resource")
    def _check_resource(self, key: str, value: str) -> str:
        return _resource_for(self.tier, value) if self.tier is not None else value


class PlanLimit(_TierRate, Model):
    """One rate of a plan: a tier (``endpoint`` rows name their resource, and may name
    what it counts: ``unit``, None for requests)."""

    __tablename__ = "quota_plan_limits"
    __table_args__ = (
        UniqueConstraint("plan_id", "tier", "resource"),
        CheckConstraint(f"tier IN ({_TIERS})", name="tier"),
        CheckConstraint(_RESOURCE_CHECK, name="resource"),
        # The other tiers count requests, whatever the resource.
        CheckConstraint("unit IS NULL OR tier = 'endpoint'", name="unit"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    plan_id: Mapped[int] = mapped_column(ForeignKey("quota_plans.id", ondelete="CASCADE"))
    algorithm: Mapped[str | None] = mapped_column(String(32))  # None: QUOTA_ALGORITHM
    shadow: Mapped[bool] = mapped_column(Boolean, default=False)  # decided, recorded, never denies
    unit: Mapped[str | None] = mapped_column(String(validators.UNIT_MAX))

    plan: Mapped[PlanRecord] = relationship(back_populates="limits")

    @validates("algorithm")
    def _check_algorithm(self, key: str, value: str | None) -> str | None:
        if value is None:
            return None
        return validators.algorithm(value).value

    @validates("unit")
    def _check_unit(self, key: str, value: str | None) -> str | None:
        return None if value is None else validators.unit_name(value)


class Client(Model):
    """An API client. Only a salted hash of its key is stored, plus a display prefix.

    ``tenant``: the customer organisation it belongs to (its callers share the tenant
    tier's bucket); ``billing_day``: the day its ``N/month`` quotas reset on, else
    ``QUOTA_BILLING_DAY``.
    """

    __tablename__ = "quota_clients"
    __table_args__ = (
        UniqueConstraint("name"),
        UniqueConstraint("key_prefix"),
        Index(None, "tenant"),
        CheckConstraint("billing_day BETWEEN 1 AND 31", name="billing_day"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    plan_id: Mapped[int] = mapped_column(ForeignKey("quota_plans.id"))
    key_prefix: Mapped[str] = mapped_column(String(16))
    key_salt: Mapped[str] = mapped_column(String(64))
    key_hash: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    tenant: Mapped[str | None] = mapped_column(String(validators.TENANT_MAX))
    billing_day: Mapped[int | None] = mapped_column(Integer)

    plan: Mapped[PlanRecord] = relationship()
    overrides: Mapped[list[Override]] = relationship(
        back_populates="client", cascade="all, delete-orphan", order_by="Override.id"
    )

    @validates("name")
    def _check_name(self, key: str, value: str) -> str:
        return validators.client_name(value)

    @validates("tenant")
    def _check_tenant(self, key: str, value: str | None) -> str | None:
        return None if value is None else validators.tenant_name(value)

    @validates("billing_day")
    def _check_billing_day(self, key: str, value: int | None) -> int | None:
        return None if value is None else validators.billing_day(value)


class Override(_TierRate, Model):
    """A rate of its own for one tier (and resource), until ``expires_at`` if set: for
    one client, or for every caller of one ``tenant`` (a client's own wins)."""

    __tablename__ = "quota_overrides"
    __table_args__ = (
        UniqueConstraint("client_id", "tier", "resource"),
        UniqueConstraint("tenant", "tier", "resource"),
        CheckConstraint(f"tier IN ({_TIERS})", name="tier"),
        CheckConstraint(_RESOURCE_CHECK, name="resource"),
        CheckConstraint(_TARGET_CHECK, name="target"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    client_id: Mapped[int | None] = mapped_column(
        ForeignKey("quota_clients.id", ondelete="CASCADE")
    )
    tenant: Mapped[str | None] = mapped_column(String(validators.TENANT_MAX))
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    client: Mapped[Client | None] = relationship(back_populates="overrides")

    @validates("tenant")
    def _check_tenant(self, key: str, value: str | None) -> str | None:
        return None if value is None else validators.tenant_name(value)


CIDR_MAX = 49  # the longest normalised network text (an IPv6 one is at most 43)
NETWORK_REASON_MAX = 200


class NetworkRecord(Model):
    """An operator's rule for a whole network: ``deny`` (its requests get 403) or
    ``allow`` (they skip the per-IP global tier), until ``expires_at`` if set. ``cidr``
    is the network's normalised text (``core.networks.parse_network``), one rule per
    network; requests match them in-process (``core.networks.NetworkRules``)."""

    __tablename__ = "quota_networks"
    __table_args__ = (
        UniqueConstraint("cidr"),
        CheckConstraint("action IN ('deny', 'allow')", name="action"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cidr: Mapped[str] = mapped_column(String(CIDR_MAX))
    action: Mapped[str] = mapped_column(String(8))
    reason: Mapped[str] = mapped_column(String(NETWORK_REASON_MAX), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[str] = mapped_column(String(200))
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class AuditEntry(Model):
    """Who changed what, when: the row's state before and after, as JSON."""

    __tablename__ = "quota_audit_log"
    __table_args__ = (Index(None, "at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    actor: Mapped[str] = mapped_column(String(200))
    action: Mapped[str] = mapped_column(String(64))  # e.g. "plan.limit.set"
    target: Mapped[str] = mapped_column(String(200))  # e.g. "plan:free", "client:7"
    before: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    after: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class QuotaMeta(Model):
    """One row whose ``version`` every change bumps in its own transaction.

    Each process polls this single value and reloads its snapshot when it moved:
    that is how a change reaches every worker without a query per request.
    """

    __tablename__ = "quota_meta"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, default=1)


CALLER_MAX = 200  # a longer identity is filed under its digest (ledger.caller_of)


class UsageRow(Model):
    """The ledger (``QUOTA_LEDGER``): one caller's use of one resource on one day (in
    ``QUOTA_TIMEZONE``). ``resource`` ``''`` counts the caller's requests themselves
    (what the global, tenant and user tiers count); a named one, the units its endpoint
    limit charged (after refunds and settlement). ``tenant`` ``''``: none."""

    __tablename__ = "quota_usage"
    __table_args__ = (
        UniqueConstraint("day", "caller", "tenant", "resource"),
        Index(None, "caller", "day"),
        Index(None, "tenant", "day"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    day: Mapped[date] = mapped_column(Date)
    caller: Mapped[str] = mapped_column(String(CALLER_MAX))  # a client's id, or an identity
    tenant: Mapped[str] = mapped_column(String(validators.TENANT_MAX), default="")
    resource: Mapped[str] = mapped_column(String(64), default="")
    units: Mapped[int] = mapped_column(BigInteger, default=0)  # admitted and kept
    requests: Mapped[int] = mapped_column(BigInteger, default=0)  # admitted
    denied: Mapped[int] = mapped_column(BigInteger, default=0)  # refused (429)


class LedgerFlush(Model):
    """A ledger flush that committed: its id is written in the flush's own transaction,
    so a flush retried after an unclear failure (a commit whose answer was lost) is
    recognised and not counted twice. Rows older than a day are deleted."""

    __tablename__ = "quota_usage_flushes"
    __table_args__ = (Index(None, "at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class WebhookEvent(Model):
    """An event waiting to be sent to ``QUOTA_WEBHOOK_URL``, or sent, or given up on
    (the outbox). ``id`` is the event's own (receivers de-duplicate by it); a sender
    claims a due row by moving ``locked_until`` (one sender per event at a time)."""

    __tablename__ = "quota_webhook_events"
    __table_args__ = (
        Index(None, "status", "next_attempt_at"),
        CheckConstraint("status IN ('pending', 'delivered', 'failed')", name="status"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    type: Mapped[str] = mapped_column(String(32))
    created: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    locked_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


CREDIT_NOTE_MAX = 500


class CreditGrant(Model):
    """Prepaid credits granted to a caller (``quota.grant``, ``flask quota credits
    grant``, the dashboard): ``units`` of ``resource`` (a plan's ``"credits"`` resource)
    for ``caller`` (an identity id: an SQL client's is its id), spendable until
    ``expires_at`` (None: never). Rows are never changed or deleted: a grant is money
    given, and the audit log names who gave it."""

    __tablename__ = "quota_credit_grants"
    __table_args__ = (
        Index(None, "caller", "resource"),
        Index(None, "created_at"),
        CheckConstraint("units >= 1", name="units"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    caller: Mapped[str] = mapped_column(String(CALLER_MAX))
    resource: Mapped[str] = mapped_column(String(64))
    units: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    note: Mapped[str] = mapped_column(String(CREDIT_NOTE_MAX), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[str] = mapped_column(String(200))


class CreditBalance(Model):
    """The last checkpoint of a caller's balance of one resource: the counter storage's
    state (``core.credits.dump``) and its ``version``, written within a sync interval of
    each change (a newer version only). What a balance is rebuilt from when the counter
    storage has lost it (``flask_quota.credits``)."""

    __tablename__ = "quota_credit_balances"
    __table_args__ = (UniqueConstraint("caller", "resource"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    caller: Mapped[str] = mapped_column(String(CALLER_MAX))
    resource: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(Text)
    version: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
