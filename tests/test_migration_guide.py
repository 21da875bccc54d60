"""What docs/flask-limiter.md (and the README's summary of it) promises a ported app
is what the code does: decorator-only behaviour, the built-in plans otherwise, and the
places where the semantics differ from Flask-Limiter's."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from flask import Blueprint, Flask
from flask.testing import FlaskClient

from flask_quota import Quota, signals
from flask_quota.core.algorithms import Outcome
from flask_quota.core.plans import DEFAULT_PLANS
from flask_quota.core.policy import Decision, TierResult
from flask_quota.core.rates import parse_rate
from flask_quota.core.tiers import Tier
from flask_quota.storage import MemoryStorage
from flask_quota.testing import FrozenClock

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "docs" / "flask-limiter.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")

# The two lines both documents give for "only my decorators limit": one plan without a
# global or user rate, and the quota tables (if the app has them) made to follow it.
DECORATOR_ONLY_LINES = (
    'app.config["QUOTA_PLANS"] = {"free": {}}',
    'app.config["QUOTA_PLANS_SOURCE"] = "config"',
)
DECORATOR_ONLY: dict[str, Any] = {"QUOTA_PLANS": {"free": {}}, "QUOTA_PLANS_SOURCE": "config"}

# The str(decision) the guide shows for the built-in free plan's 6th ai_inference call.
BREACH_SUMMARY = "denied by endpoint 'ai_inference': 5 per 60 s on plan 'free', retry in 12 s"


def statuses(client: FlaskClient, path: str, n: int) -> list[int]:
    return [client.get(path).status_code for _ in range(n)]


def ported_app(app: Flask, clock: FrozenClock, **config: Any) -> tuple[Quota, FlaskClient]:
    """Flask-Limiter's `@limiter.limit("1000/minute")` on one view, ported line by line."""
    app.config.update(config)
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/search")
    @quota.limit("1000/minute")
    def search() -> str:
        return "ok"

    return quota, app.test_client()


def test_both_documents_give_the_same_decorator_only_setting() -> None:
    """The guide and the README name one and the same way to get decorator-only
    behaviour, and it is the configuration the tests below run."""
    for line in DECORATOR_ONLY_LINES:
        assert line in GUIDE, f"docs/flask-limiter.md lacks {line}"
        assert line in README, f"README.md lacks {line}"
    config = {}
    for line in DECORATOR_ONLY_LINES:
        target, _, value = line.partition(" = ")
        config[target.removeprefix('app.config["').removesuffix('"]')] = ast.literal_eval(value)
    assert config == DECORATOR_ONLY


def test_decorator_only_plans_admit_all_150_requests_under_1000_per_minute(
    app: Flask, clock: FrozenClock
) -> None:
    """With plans that define no global or user rate, only the decorator limits: 150
    requests in the same instant under "1000/minute" are all admitted."""
    _, client = ported_app(app, clock, **DECORATOR_ONLY)
    assert statuses(client, "/search", 150) == [200] * 150
    policy = client.get("/search").headers["RateLimit-Policy"]
    assert policy == '"search";q=1000;w=60'  # no global, no user tier


def test_decorator_only_holds_when_the_quota_tables_hold_the_built_in_plans(
    tmp_path: Path, clock: FrozenClock
) -> None:
    """An app that ran once on the built-in plans has them in its quota tables; the
    same two lines still make it decorator-only at the next start (the tables follow
    QUOTA_PLANS), where QUOTA_PLANS alone would lose to the database."""
    url = f"sqlite:///{tmp_path / 'quota.sqlite3'}"

    def start(**config: Any) -> tuple[Flask, list[int]]:
        app = Flask(__name__, instance_path=str(tmp_path / "instance"))
        _, client = ported_app(app, FrozenClock(clock.seconds), QUOTA_DATABASE_URL=url, **config)
        assert app.extensions["quota"].sql.wait_loaded(10), "the SQL snapshot did not load"
        codes = statuses(client, "/search", 150)
        app.extensions["quota"].sql.close()
        return app, codes

    _, before = start()  # seeds the tables with the built-in plans
    assert before.count(200) == 50
    _, alone = start(QUOTA_PLANS=DECORATOR_ONLY["QUOTA_PLANS"])
    assert alone.count(200) == 50  # the database wins: the guide says so
    _, after = start(**DECORATOR_ONLY)
    assert after == [200] * 150


def test_built_in_plans_cap_a_ported_decorator_only_app(app: Flask, clock: FrozenClock) -> None:
    """Without QUOTA_PLANS the built-in free plan applies to every route: in one instant
    its global tier (50/second per IP) admits 50 of 150, whatever the decorator says."""
    _, client = ported_app(app, clock)
    got = statuses(client, "/search", 150)
    assert got.count(200) == 50 and got[:50] == [200] * 50
    assert client.get("/search").get_json()["tier"] == "global"
    # The guide names both caps as the code defines them.
    glob, user = (parse_rate(DEFAULT_PLANS["free"][tier]) for tier in ("global", "user"))
    assert (glob.window, user.window) == (1, 60)
    assert f"{glob.limit} requests per second per IP" in GUIDE
    assert f"{user.limit} per minute per caller" in GUIDE


def test_exempting_a_parent_blueprint_exempts_nested_ones_without_a_limit(
    app: Flask, clock: FrozenClock
) -> None:
    """`quota.exempt(parent)` frees a nested blueprint that has no limit of its own
    (Flask-Limiter's ExemptionScope.DESCENDENTS); one with its own limit keeps it."""
    app.config["QUOTA_PLANS"] = {"free": {"user": "1/minute"}}
    quota = Quota(app, storage=MemoryStorage(clock))
    parent, plain, limited = (
        Blueprint("p", __name__),
        Blueprint("c", __name__),
        Blueprint("l", __name__),
    )
    plain.add_url_rule("/x", "x", lambda: "x")
    limited.add_url_rule("/y", "y", lambda: "y")
    quota.limit("2/minute")(limited)
    quota.exempt(parent)
    parent.register_blueprint(plain, url_prefix="/plain")
    parent.register_blueprint(limited, url_prefix="/limited")
    app.register_blueprint(parent, url_prefix="/p")
    client = app.test_client()
    assert statuses(client, "/p/plain/x", 5) == [200] * 5
    assert statuses(client, "/p/limited/y", 2) == [200, 429]  # its own limit, and the user tier
    assert "ExemptionScope.DESCENDENTS" in GUIDE


def test_a_blueprint_limit_gives_each_view_its_own_bucket(app: Flask, clock: FrozenClock) -> None:
    """The guide's stand-in for default_limits: `quota.limit(rate)(bp)` gives each view of
    the blueprint without a limit of its own a bucket of that rate; a view's own wins."""
    app.config.update(DECORATOR_ONLY)
    quota = Quota(app, storage=MemoryStorage(clock))
    api = Blueprint("api", __name__)
    api.add_url_rule("/a", "a", lambda: "a")
    api.add_url_rule("/b", "b", lambda: "b")
    api.add_url_rule("/c", "c", quota.limit("1/minute")(lambda: "c"))
    quota.limit("2/minute")(api)
    app.register_blueprint(api)
    client = app.test_client()
    assert statuses(client, "/a", 3) == [200, 200, 429]
    assert statuses(client, "/b", 3) == [200, 200, 429]  # not /a's bucket
    assert statuses(client, "/c", 2) == [200, 429]
    assert 'quota.limit("100/minute")(bp)' in GUIDE


def test_cost_weighs_the_endpoint_tier_only(app: Flask, clock: FrozenClock) -> None:
    """cost=5 takes 5 units of the endpoint tier but one request of the user tier: a
    user tier of 3/minute admits three such requests, not none."""
    app.config["QUOTA_PLANS"] = {"free": {"user": "3/minute"}}
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/export")
    @quota.limit("100/minute", cost=5)
    def export() -> str:
        return "ok"

    client = app.test_client()
    assert statuses(client, "/export", 4) == [200, 200, 200, 429]
    assert client.get("/export").get_json()["tier"] == "user"


def test_fixed_windows_are_aligned_to_the_clock(app: Flask) -> None:
    """A fixed window starts on the clock's boundary, not at the first hit: 20 s into a
    minute, a 2/minute limit's third request waits 40 s, not 60 s."""
    clock = FrozenClock(start=1_700_000_000.0)  # 20 s past a whole minute
    assert clock.seconds % 60 == 20
    app.config.update(DECORATOR_ONLY, QUOTA_ALGORITHM="fixed_window")
    quota = Quota(app, storage=MemoryStorage(clock))

    @app.get("/r")
    @quota.limit("2/minute")
    def r() -> str:
        return "ok"

    client = app.test_client()
    assert statuses(client, "/r", 2) == [200, 200]
    assert client.get("/r").headers["Retry-After"] == "40"
    assert "aligned to the clock" in GUIDE


def test_a_quota_exceeded_receiver_can_tell_which_limit_fired(
    app: Flask, clock: FrozenClock
) -> None:
    """The guide's on_breach replacement: str(decision) in a signals.quota_exceeded
    receiver names the tier, resource, limit, plan and the wait, as the guide shows."""
    quota = Quota(app, storage=MemoryStorage(clock))  # the built-in plans

    @app.post("/v1/ai/infer")
    @quota.limit(resource="ai_inference")
    def infer() -> str:
        return "ok"

    seen: list[str] = []

    def on_breach(sender: Flask, decision: Decision, **extra: Any) -> None:
        seen.append(str(decision))

    signals.quota_exceeded.connect(on_breach, app)
    try:
        client = app.test_client()
        codes = [client.post("/v1/ai/infer").status_code for _ in range(6)]
    finally:
        signals.quota_exceeded.disconnect(on_breach, app)
    assert codes == [200] * 5 + [429]
    assert seen == [BREACH_SUMMARY]
    assert BREACH_SUMMARY in GUIDE


def _result(
    tier: Tier,
    name: str,
    rate: str,
    allowed: bool,
    remaining: int,
    retry_s: int = 0,
    shadow: bool = False,
) -> TierResult:
    """A tier's result as the storage would give it, reset a minute after time 0."""
    r = parse_rate(rate)
    outcome = Outcome(allowed, r.limit, remaining, 10**6 * 60, retry_s * 10**6)
    return TierResult(tier, name, r, outcome, None if tier is not Tier.ENDPOINT else name, shadow)


def test_decision_str_summarises_allowed_decisions_and_further_windows() -> None:
    """str(Decision): an admitted request names its closest tier and what is left; a
    denial by a limit's further window names that window's policy; shadow tiers that
    would have denied are said to be shadow. repr() keeps every field."""
    allowed = Decision(
        "pro",
        (
            _result(Tier.GLOBAL, "global", "50/second", True, 49),
            _result(Tier.USER, "user", "100/minute", True, 97),
            _result(Tier.ENDPOINT, "search", "10/minute", True, 3, shadow=True),
        ),
        0,
    )
    assert str(allowed) == "allowed on plan 'pro'; closest: global, 49 of 50 left"
    shadowed = Decision("pro", (_result(Tier.USER, "user", "2/minute", False, 0, 30, True),), 0)
    assert str(shadowed) == "allowed on plan 'pro'; shadow user would have denied"
    daily = Decision("free", (_result(Tier.USER, "user@86400", "1000/day", False, 0, 3600),), 0)
    expected = "denied by user 'user@86400': 1000 per 86400 s on plan 'free', retry in 3600 s"
    assert str(daily) == expected
    assert repr(daily).startswith("Decision(plan='free', results=(TierResult(")


def table_cell(text: str, first_cell: str) -> str:
    """The second cell of the Markdown table row whose first cell is ``first_cell``."""
    rows = [line for line in text.splitlines() if line.startswith(f"| {first_cell} |")]
    assert len(rows) == 1, f"no single row for {first_cell} in the document"
    return rows[0].removeprefix(f"| {first_cell} |").removesuffix("|").strip()


def test_readme_leaves_default_limits_to_the_guide() -> None:
    """The README once summed up the port in a table of its own whose default_limits row
    disagreed with the guide's recipe (in 3 of 7 request sequences). It now links the
    guide and maps nothing itself, so the two cannot disagree; the guide's row gives the
    plans' user and global tiers, and a blueprint limit for a bucket per route."""
    assert "(docs/flask-limiter.md)" in README
    assert not [line for line in README.splitlines() if line.startswith("| `default_limits`")]
    guide = table_cell(GUIDE, "`default_limits=[...]` (one budget per route)")
    assert "`user`" in guide and "`global`" in guide and "quota.limit(...)(bp)" in guide


def test_the_guide_names_a_counterpart_for_each_flask_limiter_feature_of_issue_22() -> None:
    """Callable rates, stacked limits, non-view code, header names, error_message=, the
    route listing and app-wide defaults: each has its counterpart in the guide (the
    snippets for the APIs of SPEC 8.3 are run by their own tests as those land)."""
    for counterpart in (
        "@quota.limit(lambda",
        "### Stacked limits",
        "with quota.limited(",
        "concurrent=2",
        "quota.settle(",
        "QUOTA_HEADER_NAMES",
        "error_message=",
        "| `flask limiter limits` | `flask quota routes`",
        "## Defaults for every view",
        "`@quota.request_filter`",
        "default_limits_deduct_when",
    ):
        assert counterpart in GUIDE, counterpart


def test_a_flask_limiter_semicolon_rate_is_refused_with_the_comma_form() -> None:
    """ "1/second;10/minute" raises when the decorator runs, and the message gives the
    comma form, word for word as the guide quotes it."""
    quota = Quota()
    try:
        quota.limit("1/second;10/minute")
    except ValueError as exc:
        message = str(exc)
    else:  # pragma: no cover - the assertion below reports it
        message = ""
    quoted = "to give several rates, separate them with commas: '1/second, 10/minute'"
    assert quoted in message
    assert quoted in GUIDE


def _python_block_with(text: str, needle: str) -> str:
    """The fenced Python block of ``text`` that contains ``needle``."""
    blocks = text.split("```python\n")[1:]
    found = [block.split("```", 1)[0] for block in blocks if needle in block.split("```", 1)[0]]
    assert len(found) == 1, f"no single Python block with {needle}"
    return found[0]


def test_the_guides_header_names_snippet_renames_the_headers(
    app: Flask, clock: FrozenClock
) -> None:
    """The guide's QUOTA_HEADER_NAMES snippet, run as written, renames the headers of a
    ported app; the old names are gone."""
    exec(_python_block_with(GUIDE, 'app.config["QUOTA_HEADER_NAMES"]'), {"app": app})
    _, client = ported_app(app, clock, **DECORATOR_ONLY)
    response = client.get("/search")
    assert response.headers["X-Quota-Limit"] == "1000"
    assert response.headers["X-Quota-Remaining"] == "999"
    assert "X-RateLimit-Limit" not in response.headers
    assert "X-RateLimit-Remaining" not in response.headers


def test_flask_quota_routes_lists_a_ported_view(app: Flask, clock: FrozenClock) -> None:
    """The guide's counterpart of `flask limiter limits` lists the ported view's limit."""
    ported_app(app, clock, **DECORATOR_ONLY)
    result = app.test_cli_runner().invoke(args=["quota", "routes"])
    assert result.exit_code == 0, result.output
    (line,) = [row for row in result.stdout.splitlines() if row.startswith("/search ")]
    assert line.split()[:5] == ["/search", "GET", "search", "search", "1000/minute"]
