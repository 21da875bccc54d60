"""Who owns the plans: ``QUOTA_PLANS`` (code) or the SQL tables (operators).

``QUOTA_PLANS_SOURCE=database`` (the default): ``QUOTA_PLANS`` seeds an empty
plan table once, then the table is the truth; at start-up each process logs one
warning naming every difference between the two, so an edit of ``QUOTA_PLANS``
that no longer applies is never silent. ``QUOTA_PLANS_SOURCE=config``:
``QUOTA_PLANS`` is applied to the table at every start (audited, actor
``config``), and operators' plan edits are refused. Either way clients and
overrides belong to operators and are never touched.

``export_plans``/``import_plans`` move plans as JSON in the ``QUOTA_PLANS`` shape,
so they can live in version control.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import selectinload

from ..core import validators
from ..core.plans import Plan, catalog_from_config, plans_config
from ..core.tiers import Tier
from ..settings import PlansSource
from .admin import QuotaAdmin
from .errors import AdminError
from .mapping import plan_from_record, plan_limits
from .models import PlanRecord
from .store import SqlStore

__all__ = ["CONFIG_ACTOR", "at_start", "drift", "export_plans", "import_plans", "sql_plans"]

log = logging.getLogger("flask_quota")

CONFIG_ACTOR = "config"  # the audit log's actor for changes QUOTA_PLANS_SOURCE=config makes


def sql_plans(store: SqlStore) -> list[Plan]:
    """Every plan in the SQL tables, in upgrade order."""
    with store.session() as session:
        records = session.scalars(
            select(PlanRecord)
            .options(selectinload(PlanRecord.limits))
            .order_by(PlanRecord.position, PlanRecord.id)
        ).all()
        return [plan_from_record(record) for record in records]


def _limits(plan: Plan) -> dict[tuple[Tier, str], tuple[str, str, bool, str]]:
    """(tier, resource) -> (rates text, algorithm or "default", shadow, unit or "default")."""
    found = {}
    for tier, resource, rates in plan_limits(plan):
        mode = plan.mode_for(tier, resource)
        algorithm = mode.algorithm.value if mode.algorithm is not None else "default"
        unit = plan.units.get(resource, "default") if resource else "default"
        found[(tier, resource)] = (str(rates), algorithm, mode.shadow, unit)
    return found


def drift(config: list[Plan], database: list[Plan]) -> list[str]:
    """Every difference between ``QUOTA_PLANS`` (``config``) and the SQL plans, one line each."""
    ours = {plan.name: plan for plan in config}
    theirs = {plan.name: plan for plan in database}
    lines = [
        f"plan {name!r} is in QUOTA_PLANS but not in the database"
        for name in ours.keys() - theirs.keys()
    ]
    lines += [
        f"plan {name!r} is in the database but not in QUOTA_PLANS"
        for name in theirs.keys() - ours.keys()
    ]
    lines.sort()
    for name in [n for n in ours if n in theirs]:
        if ours[name].concurrent != theirs[name].concurrent:
            mine_, stored_ = (p.concurrent or "none" for p in (ours[name], theirs[name]))
            lines.append(
                f"plan {name!r}: concurrent {mine_} in QUOTA_PLANS, {stored_} in the database"
            )
        mine, stored = _limits(ours[name]), _limits(theirs[name])
        for key in sorted(
            mine.keys() | stored.keys(), key=lambda k: (list(Tier).index(k[0]), k[1])
        ):
            where = f"plan {name!r} {key[0].value}{' ' + key[1] if key[1] else ''}"
            a, b = mine.get(key), stored.get(key)
            if a is None or b is None:
                has, lacks = (
                    ("the database", "QUOTA_PLANS")
                    if a is None
                    else ("QUOTA_PLANS", "the database")
                )
                lines.append(f"{where}: a limit in {has}, none in {lacks}")
                continue
            for field, x, y in zip(("rate", "algorithm", "shadow", "unit"), a, b, strict=True):
                if x != y:
                    lines.append(f"{where}: {field} {x} in QUOTA_PLANS, {y} in the database")
    return lines


def at_start(store: SqlStore) -> None:
    """Once per process, when the SQL tables are ready: apply ``QUOTA_PLANS``
    (``config`` source) or warn about every difference from it (``database``)."""
    settings = store.settings
    config = list(settings.plans.values())
    _warn_unsafe_names(sql_plans(store))
    if settings.plans_source is PlansSource.CONFIG:
        try:
            changes = QuotaAdmin(store, actor=CONFIG_ACTOR, applies_config=True).replace_plans(
                config, "plans.config"
            )
        except AdminError as exc:
            log.error("flask-quota: QUOTA_PLANS_SOURCE=config: QUOTA_PLANS not applied: %s", exc)
            return
        if changes:
            log.info("flask-quota: QUOTA_PLANS applied to the database: %s", "; ".join(changes))
        return
    if not settings.plans_configured:
        return  # the built-in plans seeded the table; operators own it from then on
    lines = drift(config, sql_plans(store))
    if lines:
        log.warning(
            "flask-quota: the plans in the database differ from QUOTA_PLANS, and the "
            "database wins (QUOTA_PLANS only seeds an empty plan table): %s. Set "
            "QUOTA_PLANS_SOURCE=config to apply QUOTA_PLANS at every start, or change the "
            "database with `flask quota plans set` / `flask quota plans import`.",
            "; ".join(lines),
        )


def _warn_unsafe_names(plans: list[Plan]) -> None:
    """Plans named before names were restricted (e.g. ``x/../team``) keep working for
    requests, the CLI and the API; the dashboard's URLs cannot name them safely."""
    unsafe = []
    for plan in plans:
        try:
            validators.plan_name(plan.name)
        except ValueError:
            unsafe.append(plan.name)
    if unsafe:
        log.warning(
            "flask-quota: plan(s) %s have names the dashboard cannot address safely (a "
            "browser rewrites '/' and '.' segments in its URLs); they keep working, but edit "
            "them only with `flask quota plans ...`, or replace each: `plans create NEW`, "
            "`plans set NEW ...`, `clients set-plan ID NEW`, then `plans delete OLD`",
            ", ".join(repr(name) for name in unsafe),
        )


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads`` hook: a key given twice is refused (JSON would keep the last)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise AdminError(
                f"the plans file has the key {key!r} twice in one object; keep one of them"
            )
        found[key] = value
    return found


def export_plans(store: SqlStore) -> str:
    """Every SQL plan as JSON in the ``QUOTA_PLANS`` shape."""
    return json.dumps(plans_config(sql_plans(store)), indent=2) + "\n"


def import_plans(admin: QuotaAdmin, text: str) -> list[str]:
    """Make the SQL plans exactly those of ``text`` (JSON in the ``QUOTA_PLANS`` shape):
    validated whole before anything is written, then one audited transaction."""
    try:
        raw: Any = json.loads(text, object_pairs_hook=_no_duplicate_keys)
    except json.JSONDecodeError as exc:
        raise AdminError(f"the plans file is not valid JSON: {exc}") from None
    if not isinstance(raw, Mapping):
        raise AdminError("the plans file must hold a JSON object of plan name -> settings")
    try:
        settings = admin.store.settings
        catalog = catalog_from_config(
            raw, upgrade_url=settings.upgrade_url, algorithm=settings.algorithm
        )
        for plan in catalog.values():  # what the tables accept, checked before writing
            validators.plan_name(plan.name)
            for resource in plan.resources:
                validators.resource_name(resource)
    except ValueError as exc:
        raise AdminError(str(exc).replace("QUOTA_PLANS", "plans file")) from None
    return admin.replace_plans(list(catalog.values()), "plans.import")
