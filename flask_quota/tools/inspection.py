"""Look at and reset a caller's buckets: the one door for tools.

``quota.peek()`` / ``quota.reset()``, the ``flask quota usage|reset`` commands
and the dashboard's identity pages all go through these functions, so they
agree on which plan applies to a caller and which buckets it owns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flask import Flask

from ..core.clock import seconds_until
from ..core.identity import client_ip
from ..core.keys import KeyBuilder, Tag
from ..core.leases import split
from ..core.plans import Plan, PlanCatalog
from ..core.policy import TierCheck, on_billing_day
from ..core.tiers import Tier
from ..sql.admin import QuotaAdmin
from ..state import QuotaState
from ..views import limited_endpoints

__all__ = [
    "BucketState",
    "Caller",
    "TierCheck",
    "caller_checks",
    "is_tag",
    "peek",
    "plan_of",
    "reset",
    "tenant_checks",
]


@dataclass(frozen=True, slots=True)
class Caller:
    """Whose buckets: an identity's (``tag`` ``id=...``) or an anonymous IP's (``ip=...``).

    ``ip_tag`` adds the per-IP global tier; ``identity`` is the raw id when known
    (plan and overrides are looked up by it); ``tenant`` adds the identity's tenant
    tier (a tag does not say which tenant a caller belongs to).
    """

    tag: str
    ip_tag: str | None = None
    identity: str | None = None
    tenant: str | None = None

    @classmethod
    def of(
        cls, identity: str | None = None, ip: str | None = None, tenant: str | None = None
    ) -> Caller:
        """The caller with this identity id and/or client address (and its tenant)."""
        if identity is None and ip is None:
            raise ValueError("name an identity (e.g. a client id), or an IP address, or both")
        if tenant is not None and identity is None:
            raise ValueError("a tenant belongs to an identity: name the identity too")
        ip_tag = KeyBuilder.ip_tag(client_ip(ip)) if ip is not None else None
        if identity is None:
            assert ip_tag is not None
            return cls(ip_tag, ip_tag, None)
        return cls(KeyBuilder.identity_tag(identity), ip_tag, identity, tenant)

    @classmethod
    def from_tag(cls, tag: str) -> Caller:
        """The caller behind a key tag as usage records show it (``id=...``/``ip=...``)."""
        if not Tag.valid(tag):
            raise ValueError(f"{tag[:100]!r} is not a caller tag (id=... or ip=...)")
        parsed = Tag(tag)
        if parsed.is_ip:
            return cls(tag, tag, None)
        # A digest (%h...) hides the id: the buckets are still found, the plan is the default.
        return cls(tag, None, None if parsed.hashed else parsed.value)

    @classmethod
    def guess(cls, text: str) -> Caller:
        """An operator's search: an IP address if ``text`` parses as one, else an identity."""
        ip = client_ip(text)
        return cls.of(ip=text) if ip != "unknown" else cls.of(identity=text)

    @property
    def tags(self) -> list[str]:
        """The tags a reset or block acts on: the caller's, and its address's if named."""
        if self.ip_tag is not None and self.ip_tag != self.tag:
            return [self.tag, self.ip_tag]
        return [self.tag]

    @property
    def anonymous(self) -> bool:
        """True for a caller known only by its IP address."""
        return self.identity is None and Tag(self.tag).is_ip


def is_tag(tag: str) -> bool:
    """Caller tags as the extension builds them: ``id=...`` or ``ip=...``."""
    return Tag.valid(tag)


@dataclass(frozen=True, slots=True)
class BucketState:
    """One bucket as ``peek`` saw it; nothing was charged."""

    tier: str  # "global", "tenant", "user", "endpoint" or "concurrent"
    name: str  # "global", "user" or "resource (METHOD)"
    rate: str
    limit: int
    remaining: int
    reset_in: int  # whole seconds until the bucket is full again

    @property
    def used_fraction(self) -> float:
        """How much of the bucket is used, from 0 to 1."""
        return 1 - self.remaining / self.limit if self.limit else 0.0


def plan_of(
    state: QuotaState,
    caller: Caller,
    *,
    plan: str | None = None,
    catalog: PlanCatalog | None = None,
    seen_plan: str | None = None,
) -> Plan:
    """The plan (with the caller's overrides) the request path would apply.

    ``plan`` forces a plan by name; ``seen_plan`` is the plan usage records saw
    for an identity the app's own loader knows (the catalog only knows clients).
    """
    catalog = catalog if catalog is not None else state.catalog()
    settings = state.settings
    if plan is not None and plan not in catalog:
        raise ValueError(f"unknown plan {plan!r}; known plans: {', '.join(catalog)}")
    if caller.identity is None and caller.anonymous:
        name = plan or settings.anonymous_plan
    else:
        client_plan = catalog.client_plan(caller.identity) if caller.identity else None
        name = plan or client_plan or seen_plan or settings.default_plan
    return catalog.resolve(
        name, caller.identity, fallback=settings.default_plan, tenant=_tenant(caller, catalog)
    )


def _tenant(caller: Caller, catalog: PlanCatalog) -> str | None:
    """The caller's tenant: as given, else its SQL client's (as its API key would say)."""
    if caller.tenant is not None or caller.identity is None:
        return caller.tenant
    return catalog.client_tenant(caller.identity)


def caller_checks(app: Flask, state: QuotaState, caller: Caller, plan: Plan) -> list[TierCheck]:
    """Cost-0 checks over every bucket the request path can use for ``caller``, on its
    own billing day and with its client's tenant when the catalog knows them."""
    catalog = state.catalog()
    endpoints = limited_endpoints(app, state.views)
    tenant = _tenant(caller, catalog)
    tenant_tag = KeyBuilder.tenant_tag(tenant) if tenant is not None else None
    checks = state.policy.inspection_checks(plan, caller.tag, endpoints, tenant_tag)
    day = catalog.billing_day(caller.identity) if caller.identity is not None else None
    if day is not None and 1 <= day <= 31:
        checks = list(on_billing_day(tuple(checks), day))
    if caller.ip_tag is not None and caller.ip_tag != caller.tag:  # the global tier is per IP
        ip_checks = state.policy.inspection_checks(plan, caller.ip_tag, [])
        checks[:0] = [c for c in ip_checks if c.name == "global"]
    return checks


def tenant_checks(
    state: QuotaState, tenant: str, *, plan: str | None = None, catalog: PlanCatalog | None = None
) -> list[TierCheck]:
    """Cost-0 checks over a tenant's own bucket (its tenant tier), to peek or reset it.

    The bucket's rate comes from each caller's plan, so without ``plan`` every plan
    with a tenant tier is looked at; a key two plans share is listed once (the first
    plan's rate: the one ``peek`` reports).
    """
    catalog = catalog if catalog is not None else state.catalog()
    if plan is not None and plan not in catalog:
        raise ValueError(f"unknown plan {plan!r}; known plans: {', '.join(catalog)}")
    tag = KeyBuilder.tenant_tag(tenant)
    checks: dict[str, TierCheck] = {}
    for name in [plan] if plan is not None else list(catalog):
        # With the tenant's own overrides, as its callers' requests see the plan.
        resolved = catalog.resolve(name, None, fallback=name, tenant=tenant)
        for check in state.policy.tenant_checks(resolved, tag):
            checks.setdefault(check.check.key, check)
    return list(checks.values())


def peek(state: QuotaState, checks: Sequence[TierCheck]) -> list[BucketState]:
    """Every bucket's state, read in one storage call without charging.

    Raises ``StorageError`` when the storage cannot answer.
    """
    if not checks:
        return []
    verdict = state.storage.peek([c.check for c in checks])
    return [
        BucketState(
            check.tier.value,
            check.name,
            _rate_text(check),
            outcome.limit,
            outcome.remaining,
            seconds_until(outcome.reset_us, verdict.now_us),
        )
        for check, outcome in zip(checks, verdict.outcomes, strict=True)
    ]


def reset(
    state: QuotaState,
    checks: Sequence[TierCheck],
    *,
    actor: str = "api",
    caller: Caller | None = None,
) -> int:
    """Forget the buckets of ``checks``; returns how many. Raises ``StorageError``.

    Audited under ``actor`` before anything is cleared (a ``usage.reset`` entry
    whose target is the caller's tag, from ``caller`` or else from the keys); a
    clear that fails adds ``usage.reset.failed``. So ``quota.reset``, the CLI and
    the dashboard write the same entries. Then bumps the SQL version: every
    worker's deny cache forgets its denials within the sync interval, so no worker
    keeps refusing the caller until the old retry time.
    """
    keys = [_state_key(c) for c in checks]
    tags = caller.tags if caller is not None else _tags_in(keys)
    target = tags[0] if tags else "-"
    after = {"buckets": len(keys), "tags": tags}
    with QuotaAdmin(state.sql, actor=actor).audited("usage.reset", target, None, after):
        state.storage.clear(keys)
    state.sql.bump()
    return len(keys)


def _rate_text(check: TierCheck) -> str:
    """A bucket's rate as peek shows it; a concurrency limit's slots (it has no rate)."""
    if check.tier is Tier.CONCURRENT:
        return f"{check.check.rate.limit} in flight"
    return str(check.check.rate)


def _state_key(check: TierCheck) -> str:
    """Where a check's state is stored: its key, or for a lease check its set's (a reset
    frees every slot the caller holds)."""
    return split(check.check.key)[0] if check.tier is Tier.CONCURRENT else check.check.key


def _tags_in(keys: Sequence[str]) -> list[str]:
    """The tags (``{...}`` of ``KeyBuilder``'s keys) in ``keys``, identities first
    (a tenant's, when its bucket alone is reset)."""
    tags = dict.fromkeys(key[key.find("{") + 1 : key.rfind("}")] for key in keys if "{" in key)
    return sorted(tags, key=lambda tag: not Tag(tag).is_identity)
