"""The flask-quota demo API: ``gunicorn wsgi:app``.

Every ``QUOTA_*`` setting is read from the environment variable of the same
name. With nothing set it runs on the embedded defaults: memory storage, the
seed's free/pro/enterprise plans in a SQLite file in ``instance/``, no services
needed. At first start it creates one demo client per plan and prints their API
keys (only hashes are stored: note them). Manage plans and clients with
``flask --app wsgi quota ...``; ``flask --app wsgi db upgrade`` applies the
migrations in ``migrations/``. A database that is down at start does not stop
the demo: it says so and serves the plans (built-in, or ``QUOTA_PLANS``) until
the database answers.

The operator dashboard is mounted at ``/quota`` (``QUOTA_DASHBOARD_URL``). Its
login is user ``ops`` with ``DEMO_DASHBOARD_PASSWORD``, or ``QUOTA_DASHBOARD_USERS``
(JSON of Werkzeug hashes); with neither, a password is generated at first start,
printed, and kept in ``instance/dashboard-login.txt``. Never a fixed default.

A caller reads its own quota at ``GET /rate_limit`` (``QUOTA_STATUS_URL``): its
plan and every bucket of it, counted on the global tier only.

It also shows the fourth round's capabilities, each a default that a ``QUOTA_*``
variable overrides:

- overload protection: ``QUOTA_CAPACITY=8`` requests in flight, ``POST /v1/checkout``
  critical and the slow ``GET /v1/reports`` sheddable (503 under a burst);
- the usage ledger (``QUOTA_LEDGER``): a client's usage page on the dashboard;
- a network rule, made at a start that finds none: 127.0.0.2 is denied (403);
- webhooks (``QUOTA_WEBHOOK_URL``/``SECRET``) delivered to the demo's own receiver,
  ``POST /demo/webhooks``, which checks the signature and keeps the last events for
  ``GET /demo/webhooks``. The URL needs the port the demo listens on: ``PORT`` (set by
  ``scripts/demo.sh``); without it, and without ``QUOTA_WEBHOOK_URL``, no webhooks;
- prepaid credits: ``POST /v1/sms`` spends one credit per 160-character segment, and a
  ``payg`` plan's demo client, ``demo-payg``, is granted 100 at the start that makes it
  (402 once they are spent). Made with the other demo clients, on the built-in plans
  only: with ``QUOTA_PLANS`` set, the operator's plans are the demo's.

At start it prints a short tour of ``curl`` lines.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import click
from flask import Flask, Response, jsonify, render_template_string, request
from flask_migrate import Migrate  # type: ignore[import-untyped]
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from werkzeug.security import generate_password_hash

from flask_quota import Quota
from flask_quota.sql.admin import AdminError, QuotaAdmin
from flask_quota.sql.credits import grants_of
from flask_quota.webhooks import verify

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
# The fourth round on the embedded defaults (each overridden by its QUOTA_* variable).
DEMO_CONFIG: dict[str, Any] = {
    "QUOTA_DASHBOARD_URL": "/quota",
    "QUOTA_STATUS_URL": "/rate_limit",  # the caller's own quota, as JSON
    # Requests in flight at once (one process: memory storage). With the default
    # reserves, sheddable requests get at most 5 of the 8, default ones 7, critical all.
    "QUOTA_CAPACITY": 8,
    "QUOTA_LEDGER": True,  # admitted units per client, resource and day: usage pages
}
DENIED_NETWORK = "127.0.0.2/32"  # the demo's network rule: `curl --interface 127.0.0.2`
RECEIVER = "/demo/webhooks"  # the demo's own webhook receiver
KEPT_EVENTS = 20  # the receiver keeps the last events, in memory
REPORT_SECONDS = 1.0  # how long the sheddable report takes
# Prepaid credits (docs/credits.md): the payg plan has the free plan's rates, and pays
# its SMS from a balance.
PAYG = "payg"
PAYG_CLIENT = f"demo-{PAYG}"
SMS = "sms"  # the credits resource
PAYG_LIMITS = (  # (tier, rate, resource, unit)
    ("global", "50/second", None, None),
    ("user", "100/minute", None, None),
    ("endpoint", "5/minute", "ai_inference", None),
    ("endpoint", "10/minute", "bulk_search", None),
    ("endpoint", "2000/hour", "ai_tokens", "tokens"),
    ("endpoint", "credits", SMS, "segments"),
)
PAYG_GRANT = 100  # segments granted to demo-payg at the start that makes it
SEGMENT = 160  # characters an SMS segment carries
SMS_MAX = 1600  # characters of a message sent (10 segments); the rest is cut


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__, instance_relative_config=True)
    instance = Path(app.instance_path)
    app.config.update(DEMO_CONFIG)
    app.config.update({k: v for k, v in os.environ.items() if k.startswith("QUOTA_")})
    app.config.update(config or {})
    # Serving, not a `flask ...` command: only then announce logins and make demo clients.
    serving = click.get_current_context(silent=True) is None
    port = os.environ.get("PORT")  # where the demo listens (scripts/demo.sh sets it)
    if port and "QUOTA_WEBHOOK_URL" not in app.config:
        # Webhooks to the demo's own receiver; the sender thread POSTs them off the
        # request path, and the receiver answers from another of the worker's threads.
        app.config["QUOTA_WEBHOOK_URL"] = f"http://127.0.0.1:{port}{RECEIVER}"
    if app.config.get("QUOTA_WEBHOOK_URL") and not app.config.get("QUOTA_WEBHOOK_SECRET"):
        app.config["QUOTA_WEBHOOK_SECRET"] = _kept(instance / "webhook-secret.txt")
    if app.config["QUOTA_DASHBOARD_URL"]:
        app.secret_key = os.environ.get("SECRET_KEY") or _kept(instance / "secret-key.txt")
        if not app.config.get("QUOTA_DASHBOARD_USERS"):
            password = os.environ.get("DEMO_DASHBOARD_PASSWORD") or _dashboard_password(
                instance, announce=serving
            )
            app.config["QUOTA_DASHBOARD_USERS"] = {"ops": generate_password_hash(password)}
    quota = Quota(app)  # API keys are looked up in the quota tables
    Migrate().init_app(app, directory=str(MIGRATIONS))
    if serving:  # a `flask db ...` command must find the database as it is
        # In the background: a database that is slow or down never holds up the boot.
        demo = threading.Thread(
            target=_demo_clients, args=(app, quota, port or "8000"), name="demo", daemon=True
        )
        demo.start()

    @app.get("/")
    def index() -> Any:
        return jsonify(
            service="flask-quota demo",
            endpoints=[
                "GET /v1/items",
                "GET /v1/search?q=",
                "POST /v1/ai/infer",
                "POST /v1/ai/chat",
                "POST /v1/checkout",
                "GET /v1/reports",
                "POST /v1/sms",
                "GET /healthz",
                "GET /rate_limit",
                f"GET {RECEIVER}",
            ],
            api_key_header=app.config["QUOTA_API_KEY_HEADER"],
            worker=os.getpid(),  # which gunicorn worker answered
        )

    @app.get("/v1/items")
    def items() -> Any:
        return jsonify(items=[{"id": i, "name": f"item {i}"} for i in range(1, 4)])

    @app.get("/v1/search")
    @quota.limit(resource="bulk_search")
    def search() -> Any:
        query = request.args.get("q", "")[:100]
        return jsonify(query=query, results=[])

    @app.post("/v1/ai/infer")
    @quota.limit(resource="ai_inference")
    def infer() -> Any:
        return jsonify(output="a thoughtful answer", tokens=42)

    @app.post("/v1/ai/chat")
    @quota.limit(resource="ai_tokens")
    def chat() -> Any:
        # Metered by the tokens generated, known only once the answer exists:
        # charged after the response, so a long answer can overdraw the budget
        # and the caller's next chat waits until it is paid off.
        prompt = str((request.get_json(silent=True) or {}).get("prompt", ""))[:2000]
        answer = " ".join(["token"] * min(400, 20 + len(prompt.split()) * 3))
        tokens = len(answer.split())
        quota.charge(tokens)
        return jsonify(output=answer, tokens=tokens)

    # Overload protection (docs/overload.md): under a burst, the sheddable report is
    # refused (503) first, so that checkout, critical, keeps its room.
    @app.post("/v1/checkout")
    @quota.priority("critical")
    def checkout() -> Any:
        return jsonify(order="confirmed")

    @app.get("/v1/reports")
    @quota.priority("sheddable")
    def reports() -> Any:
        time.sleep(REPORT_SECONDS)  # a slow query: it holds its slot meanwhile
        return jsonify(report="monthly", rows=[])

    # Prepaid credits (docs/credits.md): a message costs one credit per segment, taken
    # from the caller's balance (X-Credits-Balance); not enough left: 402, the balance in
    # the body. "credits" here makes SMS prepaid on every plan (the built-in plans have no
    # rate for it); the payg plan names it, in segments, and demo-payg has a balance.
    @app.post("/v1/sms")
    @quota.limit("credits", resource=SMS, cost=lambda: _segments(_sms_text()), unit="segments")
    def sms() -> Any:
        text = _sms_text()
        to = request.form.get("to", "+15550100")[:20]
        return jsonify(to=to, characters=len(text), segments=_segments(text), status="queued")

    @app.get("/healthz")
    @quota.exempt
    def health() -> Any:
        return jsonify(status="ok", worker=os.getpid())

    _webhook_receiver(app, quota)
    return app


def _sms_text() -> str:
    """The message of ``POST /v1/sms`` (form field ``text``), cut at ``SMS_MAX``."""
    return request.form.get("text", "")[:SMS_MAX]


def _segments(text: str) -> int:
    """What a message costs: one credit per ``SEGMENT`` characters begun (at least 1)."""
    return max(1, -(-len(text) // SEGMENT))


def _webhook_receiver(app: Flask, quota: Quota) -> None:
    """The demo's own webhook receiver (docs/webhooks.md): ``POST /demo/webhooks`` checks
    ``Quota-Signature`` with ``flask_quota.webhooks.verify`` (400 when it does not match),
    drops an ``id`` it has seen (deliveries are at least once), and keeps the last
    ``KEPT_EVENTS`` events in memory for ``GET /demo/webhooks`` (``?format=json``: JSON).
    Exempt: a delivery is never limited or shed."""
    events: deque[dict[str, Any]] = deque(maxlen=KEPT_EVENTS)
    lock = threading.Lock()

    @app.post(RECEIVER, endpoint="demo_webhook_receive")
    @quota.exempt
    def receive() -> Any:
        secret = app.config.get("QUOTA_WEBHOOK_SECRET") or ""
        body = request.get_data()
        header = request.headers.get("Quota-Signature", "")
        if not secret or not verify(secret, header, body, now=time.time()):
            return jsonify(error="Quota-Signature does not match: event refused"), 400
        event = json.loads(body)
        with lock:
            if all(seen["id"] != event.get("id") for seen in events):
                events.appendleft({**event, "received": time.strftime("%H:%M:%S")})
        return Response(status=204)

    @app.get(RECEIVER, endpoint="demo_webhook_events")
    @quota.exempt
    def shown() -> Any:
        with lock:
            kept = list(events)
        if request.args.get("format") == "json":
            return jsonify(events=kept, url=app.config.get("QUOTA_WEBHOOK_URL"))
        return render_template_string(EVENTS_PAGE, events=kept, app=app, kept=KEPT_EVENTS)


EVENTS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Webhooks received · flask-quota demo</title>
</head><body>
<h1>Webhooks received</h1>
{% if not app.config.get("QUOTA_WEBHOOK_URL") %}
<p>Webhooks are off: start the demo with <code>PORT</code> set (scripts/demo.sh does),
or set <code>QUOTA_WEBHOOK_URL</code>.</p>
{% else %}
<p>Events POSTed to <code>{{ app.config["QUOTA_WEBHOOK_URL"] }}</code>, each signature
checked with <code>flask_quota.webhooks.verify</code>; the last {{ kept }}, newest first.
Block a caller on the dashboard's Blocks page: its <code>caller.blocked</code> event
arrives here within a few seconds (reload).</p>
{% endif %}
<table border="1" cellpadding="4"><thead><tr><th>Received</th><th>Type</th><th>Id</th>
<th>Created</th><th>Data</th></tr></thead><tbody>
{% for e in events %}<tr><td>{{ e.received }}</td><td>{{ e.type }}</td><td>{{ e.id }}</td>
<td>{{ e.created }}</td><td><code>{{ e.data | tojson }}</code></td></tr>
{% else %}<tr><td colspan="5">Nothing received yet.</td></tr>{% endfor %}
</tbody></table></body></html>
"""


def _kept(path: Path, announce: str | None = None) -> str:
    """A random secret made once and kept in ``path`` (0600); every worker reads the same.

    Several workers start at once: the first creates the file exclusively.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):
            value = path.read_text().strip()
            if value:
                return value
            time.sleep(0.1)
        raise RuntimeError(f"{path} is empty: delete it and start again") from None
    value = secrets.token_urlsafe(24)
    with os.fdopen(fd, "w") as file:
        file.write(value + "\n")
    if announce:
        print(announce.format(value=value, path=path), file=sys.stderr)
    return value


def _dashboard_password(instance: Path, *, announce: bool) -> str:
    path = instance / "dashboard-login.txt"
    if not announce:
        return _kept(path)
    if path.exists():
        print(f"flask-quota dashboard: /quota, user 'ops', password in {path}", file=sys.stderr)
    return _kept(
        path,
        "flask-quota dashboard: log in at /quota as 'ops' with password {value} "
        "(kept in {path}; set DEMO_DASHBOARD_PASSWORD to choose your own)",
    )


def _demo_clients(app: Flask, quota: Quota, port: str = "8000") -> None:
    """One demo client per plan, made at first start; their keys are printed once. With
    them, on the built-in plans, the payg plan and its client's credits (``_prepaid``).
    Then the demo's network rule, when the database has none, and the tour.

    Several gunicorn workers start at once: a client name is unique, so a worker
    that loses the race to create one simply skips it. A database that does not
    answer is reported in one line; the demo serves on without its clients.
    """
    store = app.extensions["quota"].sql
    store.start()
    plans = "QUOTA_PLANS" if app.config.get("QUOTA_PLANS") else "the built-in plans"
    down = (
        f"flask-quota demo: the quota database at {store.display_url} does not answer; "
        f"serving {plans}, with API keys served as anonymous, until it does"
    )
    if not store.wait_loaded(timeout=60):
        print(f"{down} ({store.health().error or 'no reply'})", file=sys.stderr)
        _tour(app, port, None, None)
        return
    admin = QuotaAdmin(store, actor="wsgi demo")
    made = []
    first: str | None = None  # the first plan's demo client: its usage page is in the tour
    granted = None
    existing: dict[str, int] = {}
    # The demo's own plans (not QUOTA_PLANS, which the operator owns): payg is made here.
    ours = not store.settings.plans_configured and not admin.plans_read_only
    try:
        existing.update({client.name: client.id for client in admin.clients()})
        for plan in admin.plans():
            name = f"demo-{plan.name}"
            if ours and plan.name == PAYG:
                continue  # _prepaid's
            if name in existing:
                first = first or str(existing[name])
                continue
            try:
                info, key = admin.create_client(name, plan.name)
            except (AdminError, IntegrityError):
                continue  # another worker made it
            first = first or str(info.id)
            made.append(f"  {info.plan:<12} client {info.id:<3} {key}")
        if ours:
            granted = _prepaid(app, quota, admin, existing)
        if not admin.networks():  # the demo's rule, unless the operator has rules of their own
            # One rule per network: a worker that makes it again replaces it with the same.
            admin.deny_network(DENIED_NETWORK, reason="demo: 127.0.0.2 is refused (403)")
    except SQLAlchemyError as exc:
        reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0]
        print(f"{down} ({reason})", file=sys.stderr)
    if granted is not None:
        made.append(f"  {PAYG:<12} client {granted[0]:<3} {granted[1]}")
    if made:
        lines = "\n".join(made)
        print(
            f"flask-quota demo API keys (send as X-API-Key; shown once):\n{lines}", file=sys.stderr
        )
    if granted is not None:
        print(
            f"flask-quota demo: {PAYG_CLIENT} (client {granted[0]}) was granted {PAYG_GRANT} "
            f"prepaid {SMS} segments: POST /v1/sms spends them",
            file=sys.stderr,
        )
    payg = granted[0] if granted is not None else existing.get(PAYG_CLIENT)
    _tour(app, port, first, payg)


def _prepaid(
    app: Flask, quota: Quota, admin: QuotaAdmin, existing: dict[str, int]
) -> tuple[int, str] | None:
    """The payg plan (``PAYG_LIMITS``: free's rates, SMS paid from credits), its demo
    client and that client's ``PAYG_GRANT`` credits, made at a start that finds neither
    the plan nor the client: a new database, or one from before the plan. Returns the
    client's id and key.

    Several gunicorn workers start at once: a plan name is unique, so only the worker
    that makes the plan goes on to make its client and grant; every other skips it. The
    grant is made once: its client's grants are checked first, and a later start finds
    the plan (or, if the operator deleted it, the client) and does nothing.
    """
    if PAYG_CLIENT in existing or any(plan.name == PAYG for plan in admin.plans()):
        return None
    try:
        admin.create_plan(PAYG, "Pay as you go: SMS paid from prepaid credits (the demo)")
    except (AdminError, IntegrityError):
        return None  # another worker made it, and makes its client and grant
    for tier, rate, resource, unit in PAYG_LIMITS:
        admin.set_plan_limit(PAYG, tier, rate, resource=resource, unit=unit)
    info, key = admin.create_client(PAYG_CLIENT, PAYG)
    with app.app_context():
        if not grants_of(admin.store, str(info.id), SMS):
            quota.grant(
                client=str(info.id), resource=SMS, units=PAYG_GRANT,
                note="demo: granted at first start", actor=admin.actor,
            )  # fmt: skip
    return info.id, key


def _tour(app: Flask, port: str, client: str | None, payg: int | None) -> None:
    """A few ``curl`` lines that show what the demo does, printed once at start:
    ``client``'s usage page, and ``payg`` (demo-payg's id, when it exists) spending
    its credits and its balance."""
    url = f"http://127.0.0.1:{port}"
    lines = [
        f"curl -i -X POST {url}/v1/ai/infer          # 5/minute on the free plan: the 6th gets 429",
        f"for i in $(seq 12); do curl -s -o /dev/null -w '%{{http_code}} ' {url}/v1/reports & done;"
        " wait  # sheddable: 503s under a burst",
        f"curl -i -X POST {url}/v1/checkout          # critical: served while reports are shed",
        f"curl -i --interface 127.0.0.2 {url}/v1/items   # a network rule: 127.0.0.2 gets 403",
        f"curl -s {url}/rate_limit                    # your own quota; each limit's unit",
    ]
    prefix = f"{url}{(app.config.get('QUOTA_DASHBOARD_URL') or '').rstrip('/')}"
    if payg is not None:
        lines.append(
            f'curl -i -H "X-API-Key: $PAYG_KEY" -d text=$(printf %0400d 0) {url}/v1/sms'
            "   # payg: 400 characters, 3 credits off X-Credits-Balance; 402 once spent"
        )
        lines.append(
            f"open {prefix}/identity/id={payg}   # {PAYG_CLIENT}'s balance, grants, a grant form"
            if app.config.get("QUOTA_DASHBOARD_URL")
            else f"flask --app wsgi quota credits show {PAYG_CLIENT}   # its balance and grants"
        )
    if app.config.get("QUOTA_DASHBOARD_URL"):
        if client is not None:
            lines.append(f"open {prefix}/usage/client/{client}   # a client's usage (the ledger)")
        lines.append(f"open {prefix}/networks                # the network rules")
    if app.config.get("QUOTA_WEBHOOK_URL"):
        lines.append(
            f"open {url}{RECEIVER}   # webhooks received: block a caller on {prefix}/blocks"
            if app.config.get("QUOTA_DASHBOARD_URL")
            else f"open {url}{RECEIVER}   # webhooks received, signatures checked"
        )
    tour = "\n".join(f"  {line}" for line in lines)
    print(f"flask-quota demo tour:\n{tour}", file=sys.stderr)


app = create_app()
