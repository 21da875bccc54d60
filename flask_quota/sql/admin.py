"""Operator changes to plans, clients and overrides: validated, audited, propagated.

The CLI (and the dashboard) call these methods. Each change is one
transaction that checks its input before writing, records who did what with
the before and after state in the audit log, and bumps the version every
process polls (``SqlStore.change``). Bad input (checked by ``inputs``) raises
``AdminError`` and changes nothing. Changes outside the tables (e.g. resetting counters) run inside
``QuotaAdmin.audited``, whose entry is committed before the change is made.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, selectinload
from sqlalchemy.orm.exc import StaleDataError

from ..core.algorithms import Algorithm
from ..core.networks import DENY, parse_network
from ..core.plans import Plan, check_fit
from ..core.rates import parse_rates
from ..settings import PlansSource
from . import apikeys, inputs
from .engine import bounded
from .errors import PLANS_READ_ONLY, AdminError, ChangeConflict, PlansReadOnly, StaleEdit
from .inputs import parse_duration
from .mapping import (
    AuditInfo,
    ClientInfo,
    LimitInfo,
    NetworkInfo,
    OverrideInfo,
    PlanInfo,
    audit_info,
    client_dict,
    client_info,
    limit_rows,
    network_dict,
    network_info,
    override_dict,
    override_info,
    plan_info,
    plan_info_of,
    plan_record,
)
from .models import AuditEntry, Client, NetworkRecord, Override, PlanLimit, PlanRecord, utcnow
from .store import SqlStore

__all__ = [
    "AdminError",
    "AuditInfo",
    "ChangeConflict",
    "ClientInfo",
    "LimitInfo",
    "NetworkInfo",
    "OverrideInfo",
    "PlanInfo",
    "PlansReadOnly",
    "QuotaAdmin",
    "StaleEdit",
    "parse_duration",
]

log = logging.getLogger("flask_quota")

T = TypeVar("T")


class QuotaAdmin:
    """Reads and audited changes of the quota tables, on behalf of ``actor``."""

    def __init__(self, store: SqlStore, *, actor: str, applies_config: bool = False) -> None:
        if not actor.strip():
            raise AdminError("the actor (who makes the change) must not be empty")
        self.store = store
        self.actor = actor.strip()[:200]
        # True only for the start-up step that applies QUOTA_PLANS (QUOTA_PLANS_SOURCE=config).
        self._applies_config = applies_config

    @property
    def plans_read_only(self) -> bool:
        """True when ``QUOTA_PLANS_SOURCE=config`` owns the plans (edits are refused)."""
        config = self.store.settings.plans_source is PlansSource.CONFIG
        return config and not self._applies_config

    def check_plans_writable(self) -> None:
        """Raise ``PlansReadOnly`` when the plans follow ``QUOTA_PLANS``; every plan
        change calls this first."""
        if self.plans_read_only:
            raise PlansReadOnly(PLANS_READ_ONLY)

    # -- plans --------------------------------------------------------------

    def plans(self) -> list[PlanInfo]:
        """Every plan with its rates, in upgrade order."""
        with self.store.session() as session:
            bounded(session)
            records = session.scalars(
                select(PlanRecord).order_by(PlanRecord.position, PlanRecord.id)
            ).all()
            return [plan_info(record) for record in records]

    def create_plan(self, name: str, description: str = "") -> PlanInfo:
        """A new plan without rates, last in upgrade order (give it rates with
        ``set_plan_limit``: a tier without a rate does not apply to the plan)."""
        self.check_plans_writable()
        name_ = inputs.plan_name(name)
        description_ = inputs.description(description)

        def apply(session: Session) -> PlanInfo:
            if session.scalar(select(PlanRecord.id).where(PlanRecord.name == name_)) is not None:
                raise AdminError(f"a plan named {name_!r} exists already")
            last = session.scalar(select(func.max(PlanRecord.position)))
            record = PlanRecord(
                name=name_, description=description_, position=0 if last is None else last + 1
            )
            session.add(record)
            session.flush()
            info = plan_info(record)
            self._audit(session, "plan.create", f"plan:{name_}", None, asdict(info))
            return info

        return self._change(apply, f"plan {name_!r}")

    def delete_plan(self, name: str, *, based_on: str | None = None) -> PlanInfo:
        """Delete a plan no client uses (revoked ones included) and that is neither
        ``QUOTA_DEFAULT_PLAN`` nor ``QUOTA_ANONYMOUS_PLAN``; returns what it was.
        ``based_on``: the ``PlanInfo.token`` the operator saw (see ``StaleEdit``)."""
        self.check_plans_writable()
        settings = self.store.settings
        for key, protected in (
            ("QUOTA_DEFAULT_PLAN", settings.default_plan),
            ("QUOTA_ANONYMOUS_PLAN", settings.anonymous_plan),
        ):
            if name == protected:
                raise AdminError(
                    f"plan {name!r} is {key}: callers without a plan get it, so it cannot be "
                    f"deleted; set {key} to another plan first"
                )

        def apply(session: Session) -> PlanInfo:
            record = _locked_plan(session, name)
            before = _unchanged_since(plan_info(record), based_on)
            used, revoked = session.execute(
                select(func.count(), func.count(Client.revoked_at)).where(
                    Client.plan_id == record.id
                )
            ).one()
            if used:
                raise AdminError(
                    f"plan {name!r} is used by {used} client(s) ({revoked} of them revoked): "
                    "move them to another plan first"
                )
            session.delete(record)
            self._audit(session, "plan.delete", f"plan:{name}", asdict(before), None)
            return before

        return self._change(apply, f"plan {name!r}")

    def set_plan_limit(
        self,
        plan: str,
        tier: str,
        rate: str,
        *,
        resource: str | None = None,
        algorithm: str | None = None,
        shadow: bool | None = None,
        unit: str | None = None,
        based_on: str | None = None,
    ) -> PlanInfo:
        """Set (add or replace) one limit of a plan: its rates, and optionally its
        ``algorithm`` (``"default"``: ``QUOTA_ALGORITHM``), ``shadow`` flag and, for
        a resource, ``unit`` (``"tokens"``; ``"default"``: the decorator's, else
        requests). ``None`` keeps a limit's current algorithm, flag or unit (a new
        limit's: the default algorithm, enforced, no unit). ``based_on``: see
        ``StaleEdit``."""
        self.check_plans_writable()
        tier_ = inputs.tier(tier)
        resource_ = inputs.resource(tier_, resource)
        rate_ = inputs.rate(rate, tier_)
        algorithm_ = inputs.algorithm(algorithm)
        unit_ = inputs.unit(tier_, unit) if unit is not None else None

        def apply(session: Session) -> PlanInfo:
            record = _locked_plan(session, plan)
            before = _unchanged_since(plan_info(record), based_on)
            limit = _limit(record, tier_, resource_)
            if limit is None:
                limit = PlanLimit(tier=tier_, resource=resource_, rate=rate_, shadow=False)
                record.limits.append(limit)
            else:
                limit.rate = rate_
            if algorithm is not None:
                limit.algorithm = algorithm_
            if shadow is not None:
                limit.shadow = bool(shadow)
            if unit is not None:
                limit.unit = unit_
            self._fits(limit.rate, limit.algorithm, f"plan {plan!r}, {tier_} {resource_}".strip())
            session.flush()
            after = plan_info(record)
            self._audit(session, "plan.limit.set", f"plan:{plan}", asdict(before), asdict(after))
            return after

        return self._change(apply, f"plan {plan!r}")

    def set_plan_concurrency(
        self, plan: str, concurrent: int | str | None, *, based_on: str | None = None
    ) -> PlanInfo:
        """Bound how many requests of one caller of ``plan`` may be in flight at once,
        across every endpoint (``None`` or ``"none"``: no bound). ``based_on``: see
        ``StaleEdit``."""
        self.check_plans_writable()
        bound = inputs.concurrency(concurrent)

        def apply(session: Session) -> PlanInfo:
            record = _locked_plan(session, plan)
            before = _unchanged_since(plan_info(record), based_on)
            record.concurrent = bound
            session.flush()
            after = plan_info(record)
            self._audit(
                session, "plan.concurrent.set", f"plan:{plan}", asdict(before), asdict(after)
            )
            return after

        return self._change(apply, f"plan {plan!r}")

    def replace_plans(self, plans: list[Plan], action: str) -> list[str]:
        """Make the plan table hold exactly ``plans`` (in this order), in one audited
        transaction: plans are added, changed and removed; clients and overrides are
        not touched. A plan that clients still use cannot be removed: then nothing
        changes and ``AdminError`` names the plans and their clients. Returns one
        line per change (empty when the table already matched).
        """
        self.check_plans_writable()
        wanted = {plan.name: (position, plan) for position, plan in enumerate(plans)}
        settings = self.store.settings
        needed: dict[str, list[str]] = {}
        for key, name in (
            ("QUOTA_DEFAULT_PLAN", settings.default_plan),
            ("QUOTA_ANONYMOUS_PLAN", settings.anonymous_plan),
        ):
            if name not in wanted:
                needed.setdefault(name, []).append(key)
        if needed:
            name, keys = next(iter(needed.items()))
            raise AdminError(
                f"the new plans lack plan {name!r}, which is {' and '.join(keys)}: callers "
                f"without a plan get it. Keep {name!r} in them, or set {keys[0]} to one of "
                f"their plans first; nothing changed"
            )

        def target(position: int, plan: Plan) -> tuple[Any, ...]:
            return (position, plan_info_of(plan))

        def apply(session: Session) -> list[str]:
            records = {
                r.name: r
                for r in session.scalars(  # locked: other plan edits wait for this one
                    select(PlanRecord)
                    .order_by(PlanRecord.position, PlanRecord.id)
                    .with_for_update(key_share=True)
                )
            }
            gone = [name for name in records if name not in wanted]
            users = dict(
                session.execute(
                    select(PlanRecord.name, func.count(Client.id))
                    .join(Client, Client.plan_id == PlanRecord.id)
                    .where(PlanRecord.name.in_(gone))
                    .group_by(PlanRecord.name)
                ).all()
            )
            if users:
                used = ", ".join(f"{name!r} ({n} clients)" for name, n in sorted(users.items()))
                raise AdminError(
                    f"cannot remove plans that clients still use: {used}; move those clients "
                    "to another plan first (flask quota clients set-plan ID PLAN)"
                )
            changes = []
            for name in gone:
                before = asdict(plan_info(records[name]))
                session.delete(records[name])
                self._audit(session, f"{action}.remove", f"plan:{name}", before, None)
                changes.append(f"removed plan {name!r}")
            session.flush()
            for name, (position, plan) in wanted.items():
                record = records.get(name)
                if record is None:
                    record = plan_record(plan, position)
                    session.add(record)
                    session.flush()
                    after = asdict(plan_info(record))
                    self._audit(session, f"{action}.add", f"plan:{name}", None, after)
                    changes.append(f"added plan {name!r}")
                    continue
                if (record.position, plan_info(record)) == target(position, plan):
                    continue
                before = asdict(plan_info(record))
                record.description = plan.description
                record.upgrade_hint = plan.upgrade
                record.position = position
                record.concurrent = plan.concurrent
                record.limits.clear()
                session.flush()  # the old limits go before their replacements arrive
                record.limits.extend(limit_rows(plan))
                session.flush()
                after = asdict(plan_info(record))
                self._audit(session, f"{action}.update", f"plan:{name}", before, after)
                changes.append(f"changed plan {name!r}")
            if not changes:
                raise _Unchanged
            return changes

        try:
            return self._change(apply, "the plans")
        except _Unchanged:
            return []  # rolled back: no version bump for a table that already matched

    def delete_plan_limit(
        self, plan: str, tier: str, resource: str | None = None, *, based_on: str | None = None
    ) -> PlanInfo:
        """Remove one rate of a plan: that tier (or resource) then no longer applies to it.
        ``based_on``: see ``StaleEdit``."""
        self.check_plans_writable()
        tier_ = inputs.tier(tier)
        resource_ = inputs.resource(tier_, resource)

        def apply(session: Session) -> PlanInfo:
            record = _locked_plan(session, plan)
            before = _unchanged_since(plan_info(record), based_on)
            limit = _limit(record, tier_, resource_)
            if limit is None:
                where = f"{tier_} {resource_}" if resource_ else tier_
                raise AdminError(f"plan {plan!r} has no {where} rate to remove")
            record.limits.remove(limit)  # delete-orphan: the row goes
            session.flush()
            after = plan_info(record)
            self._audit(session, "plan.limit.delete", f"plan:{plan}", asdict(before), asdict(after))
            return after

        return self._change(apply, f"plan {plan!r}")

    # -- clients ------------------------------------------------------------

    def clients(self) -> list[ClientInfo]:
        """Every client (live and revoked), oldest first."""
        with self.store.session() as session:
            bounded(session)
            rows = session.scalars(select(Client).order_by(Client.id)).all()
            return [client_info(row) for row in rows]

    def create_client(
        self,
        name: str,
        plan: str,
        *,
        tenant: str | None = None,
        billing_day: int | str | None = None,
    ) -> tuple[ClientInfo, str]:
        """A new client and its API key: the key is returned here once and never stored.
        ``tenant``: the customer organisation whose bucket it shares; ``billing_day``:
        the day its ``N/month`` quotas reset on (else ``QUOTA_BILLING_DAY``)."""
        name = inputs.client_name(name)
        tenant_ = inputs.tenant(tenant)
        day = inputs.billing_day(billing_day)

        def apply(session: Session) -> tuple[ClientInfo, str]:
            record = _plan(session, plan)
            if session.scalar(select(Client.id).where(Client.name == name)) is not None:
                raise AdminError(f"a client named {name!r} exists already")
            new = apikeys.generate()
            while session.scalar(select(Client.id).where(Client.key_prefix == new.prefix)):
                new = apikeys.generate()  # 54 random bits: practically never
            client = Client(
                name=name, plan=record, key_prefix=new.prefix, key_salt=new.salt,
                key_hash=new.hash, tenant=tenant_, billing_day=day,
            )  # fmt: skip
            session.add(client)
            session.flush()
            info = client_info(client)
            self._audit(session, "client.create", f"client:{client.id}", None, client_dict(info))
            return info, new.key

        return self._change(apply, f"client {name!r}")

    def revoke_client(self, client_id: int | str) -> ClientInfo:
        """Revoke a client's key: from the next poll on it is treated as unknown."""

        def apply(session: Session) -> ClientInfo:
            client = _client(session, client_id)
            if client.revoked_at is not None:
                raise AdminError(f"client {client.id} is revoked already")
            before = client_dict(client_info(client))
            client.revoked_at = utcnow()
            info = client_info(client)
            self._audit(session, "client.revoke", f"client:{client.id}", before, client_dict(info))
            return info

        return self._change(apply, f"client {client_id}")

    def set_client_plan(self, client_id: int | str, plan: str) -> ClientInfo:
        """Move a client to another plan."""

        def move(session: Session, client: Client) -> None:
            client.plan = _plan(session, plan)

        return self._edit_client(client_id, "client.set_plan", move)

    def set_client_tenant(self, client_id: int | str, tenant: str | None) -> ClientInfo:
        """Move a client to another tenant (``None``: no tenant)."""
        tenant_ = inputs.tenant(tenant)

        def move(session: Session, client: Client) -> None:
            client.tenant = tenant_

        return self._edit_client(client_id, "client.set_tenant", move)

    def set_client_billing_day(self, client_id: int | str, day: int | str | None) -> ClientInfo:
        """Set the day a client's ``N/month`` quotas reset on (``None``: QUOTA_BILLING_DAY)."""
        day_ = inputs.billing_day(day)

        def move(session: Session, client: Client) -> None:
            client.billing_day = day_

        return self._edit_client(client_id, "client.set_billing_day", move)

    def _edit_client(
        self, client_id: int | str, action: str, edit: Callable[[Session, Client], None]
    ) -> ClientInfo:
        """One audited change of a client row: ``edit`` sets the new values."""

        def apply(session: Session) -> ClientInfo:
            client = _client(session, client_id)
            before = client_dict(client_info(client))
            edit(session, client)
            session.flush()
            info = client_info(client)
            self._audit(session, action, f"client:{client.id}", before, client_dict(info))
            return info

        return self._change(apply, f"client {client_id}")

    def tenants(self) -> dict[str, list[ClientInfo]]:
        """Every tenant a client names, with its clients (by name)."""
        with self.store.session() as session:
            bounded(session)
            rows = session.scalars(
                select(Client)
                .options(selectinload(Client.plan))
                .where(Client.tenant.is_not(None))
                .order_by(Client.tenant, Client.name)
            )
            found: dict[str, list[ClientInfo]] = {}
            for client in rows:
                assert client.tenant is not None
                found.setdefault(client.tenant, []).append(client_info(client))
            return found

    # -- overrides ----------------------------------------------------------

    def overrides(
        self, client_id: int | str | None = None, *, tenant: str | None = None
    ) -> list[OverrideInfo]:
        """The overrides of one client, of one tenant, or all of them."""
        with self.store.session() as session:
            bounded(session)
            query = select(Override).order_by(Override.client_id, Override.tenant, Override.id)
            if client_id is not None:
                query = query.where(
                    Override.client_id == _client(session, client_id, lock=False).id
                )
            if tenant is not None:
                query = query.where(Override.tenant == inputs.tenant(tenant))
            return [override_info(row) for row in session.scalars(query)]

    def add_override(
        self,
        client_id: int | str | None,
        tier: str,
        rate: str,
        *,
        resource: str | None = None,
        expires_in: timedelta | None = None,
        tenant: str | None = None,
    ) -> OverrideInfo:
        """Give a client (or, with ``tenant`` and no client, every caller of a tenant) its
        own rate for a tier, replacing an earlier one for the same tier and resource. A
        client's own override wins over its tenant's."""
        if (client_id is None) == (tenant is None):
            raise AdminError(
                "an override is for one client or one tenant: give --client or --tenant"
            )
        tenant_ = inputs.tenant(tenant)
        tier_ = inputs.tier(tier)
        resource_ = inputs.resource(tier_, resource)
        rate_ = inputs.rate(rate, tier_)
        if expires_in is not None and expires_in <= timedelta(0):
            raise AdminError("an override's expiry must be in the future")
        expires_at = utcnow() + expires_in if expires_in is not None else None

        def apply(session: Session) -> OverrideInfo:
            if client_id is not None:
                client = _client(session, client_id)
                limit = _limit(client.plan, tier_, resource_)
                where, target = f"the override of client {client.id}", f"client:{client.id}"
                self._fits(rate_, limit.algorithm if limit is not None else None, where)
                match = Override.client_id == client.id
            else:
                client = None
                where, target = f"the override of tenant {tenant_!r}", f"tenant:{tenant_}"
                self._fits(rate_, None, where)  # its clients' plans may differ
                match = Override.tenant == tenant_
            row = session.scalar(
                select(Override).where(
                    match, Override.tier == tier_, Override.resource == resource_
                )
            )
            before = None if row is None else override_dict(override_info(row))
            if row is None:
                row = Override(
                    client=client, tenant=tenant_, tier=tier_, resource=resource_, rate=rate_
                )
                session.add(row)
            row.rate, row.expires_at = rate_, expires_at
            session.flush()
            info = override_info(row)
            self._audit(session, "override.set", target, before, override_dict(info))
            return info

        what = f"client {client_id}" if client_id is not None else f"tenant {tenant!r}"
        return self._change(apply, f"the override of {what}")

    def remove_override(self, override_id: int | str) -> OverrideInfo:
        """Delete an override: its client gets the plan's rate again."""

        def apply(session: Session) -> OverrideInfo:
            row = session.get(Override, inputs.positive_id(override_id, "override id"))
            if row is None:
                raise AdminError(f"no override with id {override_id}")
            info = override_info(row)
            session.delete(row)
            self._audit(session, "override.remove", info.target, override_dict(info), None)
            return info

        return self._change(apply, f"override {override_id}")

    # -- networks -----------------------------------------------------------

    def networks(self) -> list[NetworkInfo]:
        """Every network rule in force (an expired one is left out, and deleted by the
        next network change), IPv4 before IPv6, in address order."""
        now = utcnow()
        with self.store.session() as session:
            bounded(session)
            rows = session.scalars(select(NetworkRecord)).all()
            found = [network_info(r) for r in rows if r.expires_at is None or r.expires_at > now]
        return sorted(found, key=_network_order)

    def set_network(
        self,
        cidr: str,
        action: str,
        *,
        expires_in: timedelta | None = None,
        reason: str | None = "",
    ) -> NetworkInfo:
        """Deny (``"deny"``: its requests get 403) or allow (``"allow"``: they skip the
        per-IP global tier) a network, IPv4 or IPv6 (``203.0.113.0/24``; a bare address is
        its /32 or /128), until ``expires_in`` from now if given. One rule per network:
        this replaces the network's earlier rule, whatever it was (audited as
        ``network.deny`` or ``network.allow``, with the rule before and after). Every
        worker applies it within the sync interval."""
        cidr_ = inputs.network(cidr)
        action_ = inputs.network_action(action)
        reason_ = inputs.network_reason(reason)
        if expires_in is not None and expires_in <= timedelta(0):
            raise AdminError("a network rule's expiry must be in the future")

        def apply(session: Session) -> NetworkInfo:
            now = utcnow()
            _purge_networks(session, now)
            row = session.scalar(select(NetworkRecord).where(NetworkRecord.cidr == cidr_))
            before = None if row is None else network_dict(network_info(row))
            if row is None:
                row = NetworkRecord(cidr=cidr_)
                session.add(row)
            # Whole seconds, as MariaDB keeps them (the audit's "after" is what is stored);
            # the expiry rounded up, so a rule lasts at least as long as asked.
            row.action, row.reason = action_, reason_
            row.created_at, row.created_by = now.replace(microsecond=0), self.actor
            row.expires_at = _whole_second_after(now + expires_in) if expires_in else None
            session.flush()
            info = network_info(row)
            self._audit(session, f"network.{action_}", info.target, before, network_dict(info))
            return info

        return self._change(apply, f"network {cidr_}")

    def deny_network(
        self, cidr: str, *, expires_in: timedelta | None = None, reason: str | None = ""
    ) -> NetworkInfo:
        """``set_network(cidr, "deny", ...)``: the network's requests get 403."""
        return self.set_network(cidr, DENY, expires_in=expires_in, reason=reason)

    def remove_network(
        self, cidr: str, *, action: str | None = None, missing_ok: bool = False
    ) -> NetworkInfo | None:
        """Delete a network's rule (audited as ``network.remove``); returns what it was.
        ``action``: only a rule that does this (``quota.unblock`` lifts denials only).
        No such rule: ``AdminError``, or None with ``missing_ok``."""
        cidr_ = inputs.network(cidr)
        action_ = inputs.network_action(action) if action is not None else None

        def apply(session: Session) -> NetworkInfo | None:
            _purge_networks(session, utcnow())
            row = session.scalar(select(NetworkRecord).where(NetworkRecord.cidr == cidr_))
            if row is None or (action_ is not None and row.action != action_):
                if missing_ok:
                    raise _Unchanged
                what = f"no {action_} rule" if action_ is not None else "no rule"
                raise AdminError(f"{what} for network {cidr_} (flask quota networks list)")
            info = network_info(row)
            session.delete(row)
            self._audit(session, "network.remove", info.target, network_dict(info), None)
            return info

        try:
            return self._change(apply, f"network {cidr_}")
        except _Unchanged:
            return None

    # -- audit --------------------------------------------------------------

    def audit_log(self, limit: int = 50) -> list[AuditInfo]:
        """The latest entries, newest first."""
        with self.store.session() as session:
            bounded(session)
            rows = session.scalars(
                select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
            ).all()
            return [audit_info(row) for row in rows]

    def record(
        self,
        action: str,
        target: str,
        before: dict[str, Any] | None = None,
        after: dict[str, Any] | None = None,
    ) -> None:
        """Commit an audit entry on its own (see ``audited`` for a change outside the tables)."""
        with self.store.session() as session, session.begin():
            bounded(session)
            self._audit(session, action, target, before, after)

    @contextmanager
    def audited(
        self,
        action: str,
        target: str,
        before: dict[str, Any] | None = None,
        after: dict[str, Any] | None = None,
    ) -> Iterator[None]:
        """Audit a change outside the tables (e.g. a counter reset), then make it::

            with admin.audited("usage.reset", "ip:1.2.3.4", None, {"buckets": 3}):
                storage.clear(keys)

        The entry is committed before the body runs: if it cannot be written, the
        error propagates and the body never runs, so no change goes unaudited. If the
        body fails, an ``<action>.failed`` entry records why (best effort).
        """
        self.record(action, target, before, after)
        try:
            yield
        except Exception as exc:
            try:
                self.record(f"{action[:57]}.failed", target, None, {"error": str(exc)[:500]})
            except SQLAlchemyError as audit_error:
                log.warning(
                    "flask-quota: %s of %s failed (%s), and so did its audit entry (%s)",
                    action, target, exc, audit_error,
                )  # fmt: skip
            raise

    def _change(self, body: Callable[[Session], T], what: str) -> T:
        """``body(session)`` in one change transaction, run again once if another writer
        inserted (or deleted) the same row meanwhile (both read "absent", the later
        insert fails; or both read "present", the later delete finds nothing): the
        second run sees the other's change and does what it would have done coming second."""
        try:
            with self.store.change() as session:
                bounded(session)
                return body(session)
        except (IntegrityError, StaleDataError):
            pass
        try:
            with self.store.change() as session:
                bounded(session)
                return body(session)
        except (IntegrityError, StaleDataError):
            raise ChangeConflict(
                f"{what} was changed by someone else at the same moment, twice; "
                "nothing was saved: try again"
            ) from None

    def _fits(self, rate: str, algorithm: str | None, where: str) -> None:
        """Refuse a rate its algorithm cannot enforce (``plans.check_fit``): the limit's
        own ``algorithm``, else ``QUOTA_ALGORITHM``. Raised inside a change, so nothing
        is written."""
        default = self.store.settings.algorithm
        try:
            chosen = Algorithm(algorithm) if algorithm else default
            check_fit(parse_rates(rate), chosen, where, default=not algorithm)
        except ValueError as exc:
            raise AdminError(str(exc)) from None

    def _audit(
        self,
        session: Session,
        action: str,
        target: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
    ) -> None:
        session.add(
            AuditEntry(
                actor=self.actor, action=action, target=target[:200], before=before, after=after
            )
        )


# -- lookups ------------------------------------------------------------------


def _network_order(info: NetworkInfo) -> tuple[int, int, int]:
    """IPv4 before IPv6, by address, the wider network first (a row edited by hand into
    nonsense last)."""
    try:
        network = parse_network(info.cidr)
    except ValueError:
        return 7, 0, 0
    return network.version, int(network.network_address), network.prefixlen


def _whole_second_after(moment: datetime) -> datetime:
    """``moment`` rounded up to a whole second."""
    whole = moment.replace(microsecond=0)
    return whole if whole == moment else whole + timedelta(seconds=1)


def _purge_networks(session: Session, now: datetime) -> None:
    """Delete the network rules that have expired: they match nothing any more (requests
    check the expiry themselves), so this only keeps the table short."""
    session.execute(
        delete(NetworkRecord)
        .where(NetworkRecord.expires_at.is_not(None), NetworkRecord.expires_at <= now)
        .execution_options(synchronize_session=False)
    )


class _Unchanged(Exception):
    """Raised inside a change to roll it back: there was nothing to do."""


def _plan(session: Session, name: str) -> PlanRecord:
    record = session.scalar(select(PlanRecord).where(PlanRecord.name == name))
    if record is None:
        known = session.scalars(select(PlanRecord.name).order_by(PlanRecord.position)).all()
        raise AdminError(f"unknown plan {name!r}; known plans: {', '.join(known)}")
    return record


def _locked_plan(session: Session, name: str) -> PlanRecord:
    """The plan, its row locked until the change commits (PostgreSQL, MySQL; a SQLite
    change holds the whole database): concurrent edits of one plan run one after the
    other, so each reads, and audits as "before", the state the previous one left."""
    # key_share: PostgreSQL's FOR NO KEY UPDATE, so rows that merely reference the plan
    # (a client created on it meanwhile) are not held up.
    query = select(PlanRecord).where(PlanRecord.name == name).with_for_update(key_share=True)
    record = session.scalar(query)
    return record if record is not None else _plan(session, name)


def _unchanged_since(info: PlanInfo, based_on: str | None) -> PlanInfo:
    """``info``, if the edit was based on it (``based_on`` is its token, or not given)."""
    if based_on is not None and based_on != info.token:
        raise StaleEdit(
            f"plan {info.name!r} was changed by someone else after this page was loaded; "
            "nothing was saved: reload the page to see its current rates, then try again"
        )
    return info


def _limit(record: PlanRecord, tier: str, resource: str) -> PlanLimit | None:
    return next((x for x in record.limits if (x.tier, x.resource) == (tier, resource)), None)


def _client(session: Session, client_id: int | str, *, lock: bool = True) -> Client:
    # Locked (until the change commits) by default: the audit's "before" of one change
    # is then the "after" of the one before it, however many operators edit at once.
    locking = {"key_share": True} if lock else None
    number = inputs.positive_id(client_id, "client id")
    client = session.get(Client, number, with_for_update=locking)
    if client is None:
        count = session.scalar(select(func.count()).select_from(Client))
        raise AdminError(f"no client with id {client_id} ({count} clients exist)")
    return client
