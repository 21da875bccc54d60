"""Dashboard routes. Every view is exempt from the app's limits, behind auth and CSRF."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict
from typing import Any, cast

from flask import (
    Blueprint,
    Flask,
    Response,
    abort,
    current_app,
    g,
    jsonify,
    redirect,
    render_template,
    request,
    url_for,
)
from flask.blueprints import BlueprintSetupState
from sqlalchemy.exc import SQLAlchemyError

from flask_quota import admin_api
from flask_quota.admin_api import (
    DEFAULT_UNIT,
    AdminError,
    Caller,
    QuotaState,
    StorageError,
    TablesMissing,
    Tag,
    bucket_units,
    exempt,
    get_state,
    parse_duration,
    resource_units,
)

from . import chart, data, session
from .admin_views import ADMIN_ROUTES, admin, client_id_of, database_errors
from .auth import Authenticator, auth_from_config
from .credit_views import CREDIT_ROUTES, client_credits
from .network_views import NETWORK_ROUTES
from .session import flash
from .tenant_views import TENANT_ROUTES
from .usage_views import USAGE_ROUTES

__all__ = ["BLUEPRINT_NAME", "make_blueprint"]

BLUEPRINT_NAME = "quota_dashboard"
REASON_MAX = 200  # what blocks.block keeps of a reason

# No inline script or style anywhere: everything is served from our static folder.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


def _authenticator() -> Authenticator:
    auth: Authenticator = current_app.extensions["quota_dashboard"]
    return auth


_reads = data.request_reads
_failure = data.failure_kind


def make_blueprint() -> Blueprint:
    bp = Blueprint(
        BLUEPRINT_NAME,
        __name__,
        template_folder="templates",
        static_folder="static",
        static_url_path="/static",
    )

    @bp.record_once
    def setup(setup_state: BlueprintSetupState) -> None:
        app = cast(Flask, setup_state.app)
        if not app.secret_key:
            raise ValueError(
                "QUOTA_DASHBOARD_URL needs app.secret_key: the dashboard signs its CSRF "
                "tokens and session with it."
            )
        state = get_state(app)
        app.extensions["quota_dashboard"] = auth_from_config(
            app.config, state.storage, state.policy.keys
        )
        app.extensions["quota_dashboard_names"] = data.NameCache()

    @bp.before_request
    def guard() -> Response | None:
        result = _authenticator().check()
        if isinstance(result, Response):
            return result
        g.quota_operator = result
        if request.method == "POST":
            token = request.form.get("csrf_token") or request.headers.get("X-CSRFToken")
            if not session.current().csrf_valid(token):
                return Response(
                    "CSRF token missing or invalid: nothing was changed. Reload the page.",
                    400,
                    content_type="text/plain",
                )
        return None

    @bp.after_request
    def security_headers(response: Response) -> Response:
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"
        session.current().save(response)
        return response

    @bp.context_processor
    def helpers() -> dict[str, Any]:
        mine = session.current()
        return {"quota_csrf_token": mine.csrf_token, "quota_messages": mine.pop_messages}

    @bp.context_processor
    def storage_status() -> dict[str, Any]:
        # Called by base.html, so every page shows an outage; lazy, as only our pages need it.
        return {
            "quota_storage": lambda: _reads().health(),
            "kind_labels": data.KIND_LABELS,
            "duration": data.duration_text,  # one way to say a span of time, on every page
            # How soon a change in SQL reaches every worker (plans, clients, networks).
            "sync_interval": f"{get_state().settings.sync_interval:g} s",
        }

    # The dashboard is never limited by the app's own quotas (logins are, see auth.py),
    # and a database that cannot answer gives a page that says so, never a 500.
    for rule, view, methods in ROUTES:
        bp.add_url_rule(rule, view_func=exempt(database_errors(view)), methods=methods)
    for rule, view, methods in (
        ADMIN_ROUTES + TENANT_ROUTES + USAGE_ROUTES + NETWORK_ROUTES + CREDIT_ROUTES
    ):
        bp.add_url_rule(rule, view_func=exempt(view), methods=methods)
    return bp


def _app() -> Flask:
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    return app


def overview_page() -> str:
    return render_template(
        "quota/overview.html",
        data=_overview(tenant_of=_tenant_of()),
        near_percent=round(100 * data.near_limit(get_state())),
    )


def overview_api() -> Response:
    return jsonify(_overview())


def _tenant_of() -> dict[str, str] | None:
    """Each SQL client's tag -> its tenant, for "usage by tenant" (one query, page only:
    the overview's poll skips it); ``None`` while the database cannot say."""
    try:
        tenants = admin().tenants()
    except (SQLAlchemyError, TablesMissing):
        return None
    return {f"id={c.id}": tenant for tenant, clients in tenants.items() for c in clients}


def _overview(tenant_of: dict[str, str] | None = None) -> dict[str, Any]:
    """``data.overview``, with API clients named by their name rather than their id."""
    state = get_state()
    found = data.overview(_app(), state, _reads(), tenant_of)
    if tenant_of is None:  # the poll, or a database that did not answer: unknown, not none
        found.pop("tenants")
    rows = found["top"] + found["near_limit"]
    names = _names(state, [row["tag"] for row in rows])
    for row in rows:
        row["name"] = names.get(row["tag"], row["name"])
    return found


def chart_svg() -> Response:
    state = get_state()
    tag = request.args.get("identity", "")
    if tag and not data.valid_tag(tag):
        abort(404)
    reads = _reads()
    storage = reads.health()
    minutes = data.usage_minutes(state, reads, tag)
    who = f" for {_label(state, tag)}" if tag else ""
    series = data.series(minutes or [])
    # A resource that counts something else than requests (tokens) says so: its panel
    # counts those units (``UsageRecorder.record``'s ``units``).
    units = resource_units(current_app, None, series)
    series = {
        f"{name} ({units[name]})" if units.get(name, DEFAULT_UNIT) != DEFAULT_UNIT else name: s
        for name, s in series.items()
    }
    svg = render_template(
        "quota/chart.svg",
        chart=chart.build(series, [m.minute for m in minutes or []]),
        title=f"Requests per minute, last hour (UTC){who}",
        unavailable=None if minutes is not None else storage["backend"],
    )
    return Response(svg, content_type="image/svg+xml")


def _names(state: QuotaState, tags: list[str]) -> dict[str, str]:
    """The client name of each tag that is a client's (``id=<client id>``)."""
    ids = {i for t in tags if (i := Tag(t).client_id) is not None}
    ids = {i for i in ids if state.catalog().client_plan(i) is not None}
    cache: data.NameCache = current_app.extensions["quota_dashboard_names"]
    found = cache.names(state, ids) if ids else {}
    return {f"id={i}": name for i, name in found.items()}


def _label(state: QuotaState, tag: str) -> str:
    """``IP 1.2.3.4``, ``user IP 1.2.3.4``, ``client acme``: the kind, then the name verbatim."""
    name = _names(state, [tag]).get(tag, data.display_name(tag))
    return f"{data.KIND_LABELS[data.identity_kind(state, tag)]} {name}"


def _canonical(tag: str) -> str:
    """The caller's tag as the extension writes it; "no such caller" (404) when it names
    nobody (an IP that is no address, a digest nobody wrote)."""
    canonical = data.canonical_tag(tag)
    if canonical is None:
        abort(
            Response(
                render_template("quota/not_found.html", tag=tag[:300]),
                404,
                content_type="text/html",
            )
        )
    return canonical


def identity_search() -> Response:
    raw = request.args.get("q", "").strip()
    if not raw:
        return redirect(url_for(".overview_page"))  # type: ignore[return-value]
    tag = data.canonical_tag(raw) or Caller.guess(raw[:200]).tag
    return redirect(url_for(".identity_page", tag=tag))  # type: ignore[return-value]


def _identity(tag: str) -> dict[str, Any]:
    state, reads = get_state(), _reads()
    reads.health()  # first: a dead storage is found by one ping, and later reads are skipped
    plan = data.identity_plan(state, reads, tag)
    checks = data.identity_checks(_app(), state, tag, plan)
    buckets = data.buckets(state, reads, checks)
    units = bucket_units(_app(), plan, checks)
    pairs = zip(buckets or [], units, strict=False)  # buckets None: the storage is down
    shown = None if buckets is None else [{**asdict(b), "unit": u} for b, u in pairs]
    info: dict[str, Any] = {
        "tag": tag,
        "kind": data.identity_kind(state, tag),
        "name": data.display_name(tag),
        "plan": plan.name,
        "buckets": shown,
        "blocked": data.block_left(state, reads, tag),
        "tiers": data.tier_totals(data.usage_minutes(state, reads, tag) or []),
        "client": None,
        "storage": reads.health(),
    }
    client_id = client_id_of(tag)
    if client_id is not None:
        a = admin()
        client = next((c for c in a.clients() if str(c.id) == client_id), None)
        if client is not None:
            info["client"] = {"id": client.id, "name": client.name, "tenant": client.tenant}
            info["name"] = client.name
            info["plans"] = [p.name for p in a.plans()]
            info["overrides"] = a.overrides(client_id)
            info["credits"] = client_credits(client_id, plan.name)  # None: no plan sells any
    return info


def identity_page(
    tag: str, block_error: str | None = None, status: int = 200, credits_error: str | None = None
) -> Any:
    canonical = _canonical(tag)
    if canonical != tag:  # e.g. a hand-typed ":": the same caller, at its own address
        return redirect(url_for(".identity_page", tag=canonical))
    info = _identity(tag)
    page = render_template(
        "quota/identity.html", info=info, block_error=block_error, credits_error=credits_error
    )
    return page, status


def identity_api(tag: str) -> Response:
    canonical = _canonical(tag)
    if canonical != tag:
        return redirect(url_for(".identity_api", tag=canonical))  # type: ignore[return-value]
    info = _identity(tag)
    info.pop("overrides", None)
    return jsonify(info)


def identity_reset(tag: str) -> Response:
    tag = _canonical(tag)
    state = get_state()
    plan = data.identity_plan(state, _reads(), tag)
    checks = data.identity_checks(_app(), state, tag, plan)
    try:
        # Audited by inspection.reset (usage.reset, then usage.reset.failed if it fails);
        # it also tells every worker to drop its cached denials.
        count = admin_api.reset(state, checks, actor=admin().actor, caller=Caller.from_tag(tag))
    except StorageError as exc:
        flash(f"Reset failed: storage unavailable ({_failure(exc)}); nothing was reset.", "error")
    else:
        flash(f"Reset {count} buckets of {_label(state, tag)}.", "ok")
    return redirect(url_for(".identity_page", tag=tag))  # type: ignore[return-value]


def blocks_page(error: str | None = None, status: int = 200) -> tuple[str, int]:
    state = get_state()
    try:
        found, listing_error = admin_api.list_blocks(state), None
    except StorageError as exc:
        found, listing_error = (
            [],
            f"Storage unavailable: blocks cannot be listed ({_failure(exc)}).",
        )
    names = _names(state, [b.tag for b in found])
    rows = [
        {
            **dataclasses.asdict(b),
            "until_text": time.strftime("%F %T", time.gmtime(b.until)),
            "kind": data.identity_kind(state, b.tag),
            "name": names.get(b.tag, b.name),
        }
        for b in found
    ]
    page = render_template(
        "quota/blocks.html", blocks=rows, error=error, listing_error=listing_error
    )
    return page, status


def _block_form() -> tuple[int, str, bool]:
    """Duration (seconds), reason and "show the reason to the caller" from the form;
    ``AdminError`` with the fix when the duration or reason is refused."""
    duration = request.form.get("duration", "").strip()
    if not duration:
        raise AdminError("say how long to block, e.g. 30m, 12h, 7d or 2w")
    seconds = int(parse_duration(duration[:20]).total_seconds())
    reason = request.form.get("reason", "").strip()
    if len(reason) > REASON_MAX:
        raise AdminError(f"the reason is {len(reason)} characters; keep it to {REASON_MAX}")
    return seconds, reason, "public" in request.form


def _block(caller: Caller, seconds: int, reason: str, public: bool) -> None:
    state, a = get_state(), admin()
    who = _label(state, caller.tag)
    try:
        admin_api.block(state, caller, seconds, reason, a.actor, public=public)
    except StorageError as exc:  # blocks.block has audited it as block.failed
        flash(
            f"Block failed: storage unavailable ({_failure(exc)}); {who} is not blocked.", "error"
        )
    else:
        shown = " The caller sees the reason." if public and reason else ""
        flash(f"Blocked {who} for {data.duration_text(seconds)}.{shown}", "ok")


def identity_block(tag: str) -> Any:
    tag = _canonical(tag)
    try:
        seconds, reason, public = _block_form()
    except AdminError as exc:
        return identity_page(tag, block_error=f"Block refused: {exc}. Nothing changed.", status=400)
    _block(Caller.from_tag(tag), seconds, reason, public)
    return redirect(url_for(".identity_page", tag=tag))


def block_new() -> Any:
    raw = request.form.get("caller", "").strip()[:200]
    try:
        if not raw:
            raise AdminError("name the caller: an identity (e.g. a client id) or an IP address")
        seconds, reason, public = _block_form()
    except AdminError as exc:
        return blocks_page(f"Block refused: {exc}. Nothing changed.", 400)
    tag = data.canonical_tag(raw)
    _block(Caller.from_tag(tag) if tag else Caller.guess(raw), seconds, reason, public)
    return redirect(url_for(".blocks_page"))


def block_lift(tag: str) -> Response:
    tag = _canonical(tag)
    state, a = get_state(), admin()
    caller = Caller.from_tag(tag)
    try:
        lifted = admin_api.unblock(state, caller, a.actor)  # audited, failure included
    except StorageError as exc:
        flash(f"Unblock failed: storage unavailable ({_failure(exc)}); still blocked.", "error")
    else:
        name = _label(state, tag)
        flash(f"Unblocked {name}." if lifted else f"{name} was not blocked.", "ok")
    back = ".identity_page" if request.form.get("next") == "identity" else ".blocks_page"
    return redirect(url_for(back, tag=tag) if back == ".identity_page" else url_for(back))  # type: ignore[return-value]


ROUTES: list[tuple[str, Any, list[str]]] = [
    ("/", overview_page, ["GET"]),
    ("/api/overview", overview_api, ["GET"]),
    ("/chart.svg", chart_svg, ["GET"]),
    ("/identity", identity_search, ["GET"]),
    ("/identity/<path:tag>", identity_page, ["GET"]),
    ("/api/identity/<path:tag>", identity_api, ["GET"]),
    ("/identity/<path:tag>/reset", identity_reset, ["POST"]),
    ("/identity/<path:tag>/block", identity_block, ["POST"]),
    ("/blocks", blocks_page, ["GET"]),
    ("/blocks/new", block_new, ["POST"]),
    ("/blocks/<path:tag>/unblock", block_lift, ["POST"]),
]
