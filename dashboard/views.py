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

from flask_quota import blocks, inspection
from flask_quota.inspection import Caller
from flask_quota.state import QuotaState, exempt, get_state
from flask_quota.storage import StorageError

from . import chart, data, session
from .admin_views import ADMIN_ROUTES, admin, client_id_of, database_errors
from .auth import Authenticator, auth_from_config
from .session import flash

__all__ = ["BLUEPRINT_NAME", "make_blueprint"]

BLUEPRINT_NAME = "quota_dashboard"

# No inline script or style anywhere: everything is served from our static folder.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


def _authenticator() -> Authenticator:
    auth: Authenticator = current_app.extensions["quota_dashboard"]
    return auth


def _reads() -> data.Reads:
    """This request's storage reads: one ping, and no more reads once one failed."""
    reads: data.Reads | None = g.get("_quota_reads")
    if reads is None:
        reads = g._quota_reads = data.Reads(get_state())
    return reads


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
        return {"quota_storage": lambda: _reads().health(), "kind_labels": data.KIND_LABELS}

    # The dashboard is never limited by the app's own quotas (logins are, see auth.py),
    # and a database that cannot answer gives a page that says so, never a 500.
    for rule, view, methods in ROUTES:
        bp.add_url_rule(rule, view_func=exempt(database_errors(view)), methods=methods)
    for rule, view, methods in ADMIN_ROUTES:
        bp.add_url_rule(rule, view_func=exempt(view), methods=methods)
    return bp


def _app() -> Flask:
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    return app


def overview_page() -> str:
    return render_template(
        "quota/overview.html",
        data=data.overview(_app(), get_state(), _reads()),
        near_percent=round(100 * data.NEAR_LIMIT),
    )


def overview_api() -> Response:
    return jsonify(data.overview(_app(), get_state(), _reads()))


def chart_svg() -> Response:
    state = get_state()
    tag = request.args.get("identity", "")
    if tag and not data.valid_tag(tag):
        abort(404)
    reads = _reads()
    storage = reads.health()
    minutes = data.usage_minutes(state, reads, tag)
    who = f" for {_label(state, tag)}" if tag else ""
    svg = render_template(
        "quota/chart.svg",
        chart=chart.build(data.series(minutes or []), [m.minute for m in minutes or []]),
        title=f"Requests per minute, last hour (UTC){who}",
        unavailable=None if minutes is not None else storage["backend"],
    )
    return Response(svg, content_type="image/svg+xml")


def _label(state: QuotaState, tag: str) -> str:
    """``IP 1.2.3.4`` or ``user IP 1.2.3.4``: the kind first, then the name verbatim."""
    return f"{data.KIND_LABELS[data.identity_kind(state, tag)]} {data.display_name(tag)}"


def identity_search() -> Response:
    raw = request.args.get("q", "").strip()
    if not raw:
        return redirect(url_for(".overview_page"))  # type: ignore[return-value]
    tag = raw if data.valid_tag(raw) else Caller.guess(raw[:200]).tag
    return redirect(url_for(".identity_page", tag=tag))  # type: ignore[return-value]


def _identity(tag: str) -> dict[str, Any]:
    if not data.valid_tag(tag):
        abort(404)
    state, reads = get_state(), _reads()
    reads.health()  # first: a dead storage is found by one ping, and later reads are skipped
    plan = data.identity_plan(state, reads, tag)
    checks = data.identity_checks(_app(), state, tag, plan)
    buckets = data.buckets(state, reads, checks)
    info: dict[str, Any] = {
        "tag": tag,
        "kind": data.identity_kind(state, tag),
        "name": data.display_name(tag),
        "plan": plan.name,
        "buckets": None if buckets is None else [asdict(b) for b in buckets],
        "tiers": data.tier_totals(data.usage_minutes(state, reads, tag) or []),
        "client": None,
        "storage": reads.health(),
    }
    client_id = client_id_of(tag)
    if client_id is not None:
        a = admin()
        client = next((c for c in a.clients() if str(c.id) == client_id), None)
        if client is not None:
            info["client"] = {"id": client.id, "name": client.name}
            info["name"] = f"{client.name} (id {client.id})"
            info["plans"] = [p.name for p in a.plans()]
            info["overrides"] = a.overrides(client_id)
    return info


def identity_page(tag: str) -> str:
    info = _identity(tag)
    return render_template("quota/identity.html", info=info)


def identity_api(tag: str) -> Response:
    info = _identity(tag)
    info.pop("overrides", None)
    return jsonify(info)


def identity_reset(tag: str) -> Response:
    if not data.valid_tag(tag):
        abort(404)
    state = get_state()
    plan = data.identity_plan(state, _reads(), tag)
    checks = data.identity_checks(_app(), state, tag, plan)
    # Audited first: a reset that then fails leaves a record, never a silent change.
    admin().record("usage.reset", tag, None, {"keys": len(checks)})
    try:
        count = inspection.reset(state, checks)  # also tells every worker to drop cached denials
    except StorageError as exc:
        flash(
            f"Reset failed: storage unavailable ({type(exc.__cause__ or exc).__name__}).", "error"
        )
    else:
        flash(f"Reset {count} buckets of {_label(state, tag)}.", "ok")
    return redirect(url_for(".identity_page", tag=tag))  # type: ignore[return-value]


def blocks_page() -> tuple[str, int]:
    try:
        found, error = blocks.list_blocks(get_state()), None
    except StorageError as exc:
        found, error = [], f"Storage unavailable: blocks cannot be listed ({exc})."
    rows = [
        {**dataclasses.asdict(b), "until_text": time.strftime("%F %T", time.gmtime(b.until))}
        for b in found
    ]
    return render_template("quota/blocks.html", blocks=rows, error=error), 200


def block_lift(tag: str) -> Response:
    if not data.valid_tag(tag):
        abort(404)
    caller = inspection.Caller.from_tag(tag)
    try:
        lifted = blocks.unblock(get_state(), caller, admin().actor)  # audited first
    except StorageError as exc:
        reason = type(exc.__cause__ or exc).__name__  # not the message: it may name the URL
        flash(f"Unblock failed: storage unavailable ({reason}).", "error")
    else:
        name = _label(get_state(), tag)
        flash(f"Unblocked {name}." if lifted else f"{name} was not blocked.", "ok")
    return redirect(url_for(".blocks_page"))  # type: ignore[return-value]


ROUTES: list[tuple[str, Any, list[str]]] = [
    ("/", overview_page, ["GET"]),
    ("/api/overview", overview_api, ["GET"]),
    ("/chart.svg", chart_svg, ["GET"]),
    ("/identity", identity_search, ["GET"]),
    ("/identity/<path:tag>", identity_page, ["GET"]),
    ("/api/identity/<path:tag>", identity_api, ["GET"]),
    ("/identity/<path:tag>/reset", identity_reset, ["POST"]),
    ("/blocks", blocks_page, ["GET"]),
    ("/blocks/<path:tag>/unblock", block_lift, ["POST"]),
]
