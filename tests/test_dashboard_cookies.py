"""The dashboard's cookie: its own (not the host's session), Lax, Secure over HTTPS, and
the CSRF token bound to it."""

from __future__ import annotations

from pathlib import Path

from flask import Flask, session
from flask.testing import FlaskClient
from werkzeug.http import parse_set_header

from dashboard.session import COOKIE
from tests.dashboards import HASH, OPS, csrf_from, dashboard_app


def set_cookies(response: object) -> dict[str, str]:
    """Name -> the whole Set-Cookie header, of every cookie a response sets."""
    headers = getattr(response, "headers")  # noqa: B009
    return {h.split("=", 1)[0]: h for h in headers.getlist("Set-Cookie")}


def attributes(header: str) -> set[str]:
    """The attributes of a Set-Cookie header, lower-cased (``samesite=lax``, ``secure``...)."""
    return {part.strip().lower() for part in header.split(";")[1:]}


def test_the_cookie_is_lax_httponly_and_scoped_to_the_dashboard(ops_app: Flask) -> None:
    """A page with a form sets the dashboard's own cookie: SameSite=Lax, HttpOnly, only
    for the dashboard's path, not Secure over plain HTTP; the host's session is not set."""
    response = ops_app.test_client().get("/quota/identity/id=ada", headers=OPS)
    cookies = set_cookies(response)
    assert "session" not in cookies, cookies  # the host's Flask session is left alone
    attrs = attributes(cookies[COOKIE])
    assert {"samesite=lax", "httponly", "path=/quota"} <= attrs, attrs
    assert "secure" not in attrs
    assert "Cookie" in parse_set_header(response.headers.get("Vary", ""))


def test_the_cookie_is_secure_over_https(ops_app: Flask) -> None:
    """Served over HTTPS, the dashboard's cookie is also Secure."""
    http = ops_app.test_client()
    response = http.get("/quota/identity/id=ada", headers=OPS, base_url="https://ops.example")
    assert {"secure", "samesite=lax"} <= attributes(set_cookies(response)[COOKIE])


def test_host_session_cookie_settings_are_untouched(tmp_path: Path) -> None:
    """The host's own session cookie keeps the host's settings (here: none, so no
    SameSite), and a dashboard change with its message never re-sets it."""
    app = dashboard_app(tmp_path, QUOTA_DASHBOARD_USERS={"ops": HASH})

    @app.get("/host-login")
    def host_login() -> str:
        session["user"] = "someone"
        return "ok"

    http = app.test_client()
    host = set_cookies(http.get("/host-login"))["session"]
    assert not any(a.startswith("samesite") for a in attributes(host)), host
    token = csrf_from(http, "/quota/identity/id=ada")
    reset = http.post("/quota/identity/id=ada/reset", headers=OPS, data={"csrf_token": token})
    assert reset.status_code == 302 and "session" not in set_cookies(reset)
    page = http.get("/quota/identity/id=ada", headers=OPS)
    assert "Reset 2 buckets" in page.get_data(as_text=True)  # the message came through
    assert "session" not in set_cookies(page)
    assert app.config["SESSION_COOKIE_SAMESITE"] is None


def test_host_login_in_its_session_still_opens_the_dashboard(tmp_path: Path) -> None:
    """QUOTA_DASHBOARD_AUTH may read the host's own session (its login): the dashboard,
    keeping its state apart, still sees it, and its forms work."""
    app = dashboard_app(tmp_path, QUOTA_DASHBOARD_AUTH=lambda: session.get("op"))

    @app.get("/host-login")
    def host_login() -> str:
        session["op"] = "alice"
        return "ok"

    http = app.test_client()
    assert http.get("/quota/").status_code == 401
    http.get("/host-login")
    page = http.get("/quota/identity/id=ada")
    assert page.status_code == 200 and "alice" in page.get_data(as_text=True)
    token = _token(page.get_data(as_text=True))
    done = http.post("/quota/identity/id=ada/reset", data={"csrf_token": token})
    assert done.status_code == 302


def _token(html: str) -> str:
    import re

    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match
    return match.group(1)


def _spend(http: FlaskClient) -> None:
    for _ in range(3):
        http.post("/infer", headers={"X-User": "ada"})


def test_a_token_works_only_with_the_cookie_it_was_issued_with(ops_app: Flask) -> None:
    """A token copied into another browser (another cookie, or none) is refused with 400
    and changes nothing; in its own browser it resets."""
    mine, other = ops_app.test_client(), ops_app.test_client()
    _spend(mine)
    token = csrf_from(mine, "/quota/identity/id=ada")
    csrf_from(other, "/quota/identity/id=ada")  # the other browser has a cookie of its own
    for http in (other, ops_app.test_client()):
        refused = http.post("/quota/identity/id=ada/reset", headers=OPS, data={"csrf_token": token})
        assert refused.status_code == 400 and b"nothing was changed" in refused.data
    assert mine.post("/infer", headers={"X-User": "ada"}).status_code == 429  # still spent
    done = mine.post("/quota/identity/id=ada/reset", headers=OPS, data={"csrf_token": token})
    assert done.status_code == 302
    assert mine.post("/infer", headers={"X-User": "ada"}).status_code == 200


def test_a_tampered_cookie_is_a_fresh_one(ops_app: Flask) -> None:
    """A cookie whose signature does not verify is ignored (a new secret is made):
    the page answers 200, and a token from before no longer passes."""
    http = ops_app.test_client()
    token = csrf_from(http, "/quota/identity/id=ada")
    http.set_cookie(COOKIE, "forged.value", path="/quota")
    page = http.get("/quota/identity/id=ada", headers=OPS)
    assert page.status_code == 200 and COOKIE in set_cookies(page)
    http.set_cookie(COOKIE, "forged.value", path="/quota")
    refused = http.post("/quota/identity/id=ada/reset", headers=OPS, data={"csrf_token": token})
    assert refused.status_code == 400
