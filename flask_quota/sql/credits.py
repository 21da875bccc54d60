"""Prepaid credits in SQL: grants (audited, never changed) and balance checkpoints.

A grant is a row of ``quota_credit_grants``; a balance's checkpoint is a row of
``quota_credit_balances`` holding the counter storage's state as it was last read
(``core.credits.dump``) and its version. The storage decides; SQL is what a lost
balance is rebuilt from (``flask_quota.credits``). No Flask here.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time
from zoneinfo import ZoneInfo

from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError

from ..core import validators
from ..core.credits import Grant
from ..core.rates import MAX_LIMIT, Credits
from .engine import bounded
from .errors import AdminError
from .models import CALLER_MAX, CREDIT_NOTE_MAX, Client, CreditBalance, CreditGrant, utcnow
from .store import SqlStore

__all__ = [
    "GrantInfo",
    "checkpoint_of",
    "client_caller",
    "credit_resources",
    "expiry",
    "grants_of",
    "new_grant",
    "recent_grants",
    "write_checkpoints",
]


@dataclass(frozen=True, slots=True)
class GrantInfo:
    """A grant as operators see it."""

    id: int
    caller: str
    resource: str
    units: int
    expires_at: datetime | None
    note: str
    created_at: datetime
    created_by: str

    @property
    def entry(self) -> Grant:
        """The grant as a balance holds it, whole (``core.credits.Grant``)."""
        expires = 0 if self.expires_at is None else int(self.expires_at.timestamp() * 1_000_000)
        return Grant(self.id, expires, self.units, self.units)

    def as_dict(self) -> dict[str, object]:
        """For the audit log and ``credits show --json``-like output."""
        return {
            "id": self.id,
            "caller": self.caller,
            "resource": self.resource,
            "units": self.units,
            "expires_at": None if self.expires_at is None else self.expires_at.isoformat(),
            "note": self.note,
            "created_by": self.created_by,
        }


def _info(row: CreditGrant) -> GrantInfo:
    return GrantInfo(
        row.id, row.caller, row.resource, row.units, row.expires_at, row.note,
        row.created_at, row.created_by,
    )  # fmt: skip


def expiry(value: datetime | date | str | None, zone: ZoneInfo) -> datetime | None:
    """A grant's expiry as given: a timezone-aware datetime, or a date (or its ISO text,
    ``"2027-01-01"``, or a datetime's, ``"2027-01-01T12:00"``) taken in ``zone``
    (``QUOTA_TIMEZONE``): a date is its midnight, the first moment it no longer counts."""
    if value is None or (isinstance(value, datetime) and value.tzinfo is not None):
        return value
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise AdminError(
                f"expiry {value!r} is not a date: use 2027-01-01 or 2027-01-01T12:00"
            ) from None
        if value.tzinfo is not None:
            return value
    if isinstance(value, datetime):
        return value.replace(tzinfo=zone)
    if isinstance(value, date):
        return datetime.combine(value, time(0), zone)
    raise AdminError(f"expiry must be a datetime, a date or its text, not {value!r}")


def credit_resources(store: SqlStore) -> set[str]:
    """The resources some plan in force makes a prepaid balance."""
    catalog = store.catalog()
    return {
        resource
        for name in catalog
        for resource, rates in catalog[name].resources.items()
        if isinstance(rates, Credits)
    }


def client_caller(store: SqlStore, client: str) -> str:
    """The identity id whose balance a grant to ``client`` fills: an SQL client's, by
    name or id (``AdminError`` when there is none)."""
    text = str(client).strip()
    with store.session() as session:
        bounded(session)
        row = session.scalar(select(Client).where(Client.name == text))
        if row is None and text.isdigit():
            row = session.get(Client, int(text))
        if row is None:
            raise AdminError(
                f"no client named {text!r} (nor with that id): flask quota clients list"
            )
        return str(row.id)


def new_grant(
    store: SqlStore,
    *,
    actor: str,
    caller: str,
    resource: str,
    units: int,
    expires_at: datetime | None = None,
    note: str = "",
) -> GrantInfo:
    """Record a grant of ``units`` of ``resource`` to ``caller`` (an identity id), audited
    as ``credits.grant`` in the same transaction. Bad input raises ``AdminError`` and
    writes nothing: units a whole number from 1 to 10^12, a resource some plan makes
    credits, an expiry in the future (timezone-aware), a note of at most 500 characters."""
    if isinstance(units, bool) or not isinstance(units, int) or not 1 <= units <= MAX_LIMIT:
        raise AdminError(f"units must be a whole number from 1 to {MAX_LIMIT}, got {units!r}")
    try:
        validators.resource_name(resource)
    except ValueError as exc:
        raise AdminError(str(exc)) from None
    known = credit_resources(store)
    if resource not in known:
        hint = (
            ", ".join(sorted(known))
            or "none: give a plan a resource such as 'ai_tokens': 'credits'"
        )
        raise AdminError(f"no plan has a credits resource {resource!r}; credits resources: {hint}")
    if not caller or len(caller) > CALLER_MAX:
        raise AdminError(f"the caller must be an identity id of 1 to {CALLER_MAX} characters")
    if expires_at is not None:
        if expires_at.tzinfo is None:
            raise AdminError("a grant's expiry needs a timezone (e.g. 2027-01-01T00:00+00:00)")
        if expires_at <= utcnow():
            raise AdminError(
                f"a grant's expiry must be in the future, not {expires_at:%Y-%m-%d %H:%M}"
            )
    if not isinstance(note, str) or len(note) > CREDIT_NOTE_MAX:
        raise AdminError(f"the note must be text of at most {CREDIT_NOTE_MAX} characters")
    actor = actor.strip()[:200] or "api"
    from .admin import QuotaAdmin  # the audit's one writer

    admin = QuotaAdmin(store, actor=actor)
    with store.change() as session:
        bounded(session)
        row = CreditGrant(
            caller=caller, resource=resource, units=units, expires_at=expires_at,
            note=note, created_by=actor,
        )  # fmt: skip
        session.add(row)
        session.flush()
        info = _info(row)
        admin._audit(session, "credits.grant", f"credits:{caller}:{resource}", None, info.as_dict())
    return info


def grants_of(store: SqlStore, caller: str, resource: str | None = None) -> list[GrantInfo]:
    """Every grant to ``caller`` (of ``resource``), oldest first."""
    query = select(CreditGrant).where(CreditGrant.caller == caller)
    if resource is not None:
        query = query.where(CreditGrant.resource == resource)
    with store.session() as session:
        bounded(session)
        return [_info(r) for r in session.scalars(query.order_by(CreditGrant.id))]


def recent_grants(store: SqlStore, since: datetime) -> list[GrantInfo]:
    """Grants made at or after ``since`` that have not expired: what every worker pushes
    to the storage again (``flask_quota.credits``), so a grant reaches each balance."""
    now = utcnow()
    query = (
        select(CreditGrant)
        .where(CreditGrant.created_at >= since)
        .where(or_(CreditGrant.expires_at.is_(None), CreditGrant.expires_at > now))
        .order_by(CreditGrant.id)
    )
    with store.session() as session:
        bounded(session)
        return [_info(r) for r in session.scalars(query)]


def checkpoint_of(store: SqlStore, caller: str, resource: str) -> tuple[str, int] | None:
    """A balance's last checkpoint: (state text, version), or None."""
    query = select(CreditBalance.state, CreditBalance.version).where(
        CreditBalance.caller == caller, CreditBalance.resource == resource
    )
    with store.session() as session:
        bounded(session)
        found = session.execute(query).first()
    return None if found is None else (found[0], int(found[1]))


def write_checkpoints(store: SqlStore, rows: Iterable[tuple[str, str, str, int]]) -> None:
    """Write (caller, resource, state, version) checkpoints, each only over an older
    version: several workers write the same balances, in any order, and the newest wins.
    One transaction; a row two workers insert at once is written by the first."""
    ordered: Sequence[tuple[str, str, str, int]] = sorted(rows)  # rows locked in one order
    if not ordered:
        return
    now = utcnow()
    with store.session() as session, session.begin():
        bounded(session)
        for caller, resource, state, version in ordered:
            changed = session.execute(
                update(CreditBalance)
                .where(
                    CreditBalance.caller == caller,
                    CreditBalance.resource == resource,
                    CreditBalance.version < version,
                )
                .values(state=state, version=version, updated_at=now)
                .execution_options(synchronize_session=False)
            )
            if changed.rowcount:  # type: ignore[attr-defined]
                continue
            exists = session.scalar(
                select(CreditBalance.id).where(
                    CreditBalance.caller == caller, CreditBalance.resource == resource
                )
            )
            if exists is None:
                try:
                    with session.begin_nested():
                        session.add(
                            CreditBalance(
                                caller=caller, resource=resource, state=state,
                                version=version, updated_at=now,
                            )
                        )  # fmt: skip
                except IntegrityError:
                    pass  # another worker inserted it meanwhile: its version stands
