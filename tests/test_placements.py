"""Where ``@quota.limit`` (and ``@quota.exempt``) may be placed, and that each placement
applies: class-based views, their methods, ``dispatch_request``, a view under a
decorator that forgot ``functools.wraps``, and a limit added after the view served
requests. Found in review: each of these admitted 6 of 6, silently, and ``flask quota
routes`` showed no limit."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

import pytest
from flask import Flask
from flask.views import MethodView, View

from flask_quota import Quota


def quota_app(app: Flask) -> Quota:
    app.config.update(QUOTA_PLANS={"free": {}}, QUOTA_DATABASE_URL="sqlite://")
    return Quota(app)


def statuses(app: Flask, path: str, n: int = 4, method: str = "GET") -> list[int]:
    client = app.test_client()
    return [client.open(path, method=method).status_code for _ in range(n)]


def routes_output(app: Flask) -> str:
    result = app.test_cli_runner().invoke(args=["quota", "routes"])
    assert result.exit_code == 0, result.output
    return result.output


def line_of(output: str, rule: str) -> str:
    (line,) = [line for line in output.splitlines() if line.split()[:1] == [rule]]
    return line


def no_wraps(view: Callable[..., Any]) -> Callable[..., Any]:
    """A decorator that forgot ``functools.wraps`` (a common login check)."""

    def inner(*args: Any, **kwargs: Any) -> Any:
        return view(*args, **kwargs)

    return inner


def class_limited(quota: Quota) -> type[MethodView]:
    @quota.limit("3/minute")
    class Reports(MethodView):
        def get(self) -> str:
            return "ok"

    return Reports


def method_limited(quota: Quota) -> type[MethodView]:
    class Reports(MethodView):
        @quota.limit("3/minute")
        def get(self) -> str:
            return "ok"

    return Reports


def dispatch_limited(quota: Quota) -> type[View]:
    class Reports(View):
        @quota.limit("3/minute")
        def dispatch_request(self) -> str:
            return "ok"

    return Reports


def decorators_limited(quota: Quota) -> type[MethodView]:
    class Reports(MethodView):
        decorators: ClassVar[list[Callable[..., Any]]] = [quota.limit("3/minute")]

        def get(self) -> str:
            return "ok"

    return Reports


@pytest.mark.parametrize(
    "make", [class_limited, method_limited, dispatch_limited, decorators_limited]
)
def test_a_class_based_view_is_limited_wherever_the_limit_sits(
    app: Flask, make: Callable[[Quota], type[View]]
) -> None:
    quota = quota_app(app)
    app.add_url_rule("/reports", view_func=make(quota).as_view("reports"))
    assert statuses(app, "/reports") == [200, 200, 200, 429]
    assert "3/minute" in line_of(routes_output(app), "/reports")


def test_a_method_views_methods_have_their_own_limits_and_the_class_its_own(app: Flask) -> None:
    """A limit on ``get`` applies to GET alone; one on the class to every method, on
    one bucket whatever the method's own limits; ``@quota.exempt`` on a method frees it."""
    quota = quota_app(app)

    @quota.limit("5/minute", per_method=False)
    class Items(MethodView):
        @quota.limit("2/minute")
        def get(self) -> str:
            return "list"

        def post(self) -> str:
            return "made"

        @quota.exempt
        def delete(self) -> str:
            return "gone"

    app.add_url_rule("/items", view_func=Items.as_view("items"))
    assert statuses(app, "/items", 3) == [200, 200, 429]  # GET: its own 2/minute
    assert statuses(app, "/items", 4, "POST") == [200, 200, 200, 429]  # the class's 5, shared
    assert statuses(app, "/items", 6, "DELETE") == [200] * 6
    output = routes_output(app)
    rows = [line.split() for line in output.splitlines() if line.split()[:1] == ["/items"]]
    by_method: dict[str, list[str]] = {}
    for row in rows:  # a line per limit: RULE METHODS ENDPOINT LIMIT RATE ...
        by_method.setdefault(row[1], []).append(" ".join(row[3:]))
    assert sorted(by_method) == ["DELETE", "GET", "POST"], output
    assert [r.split()[1] for r in by_method["GET"]] == ["5/minute", "2/minute"]
    assert [r.split()[1] for r in by_method["POST"]] == ["5/minute"]
    assert by_method["DELETE"][0].startswith("exempt (@quota.exempt on delete)")


def test_a_view_under_a_decorator_without_wraps_is_limited(
    app: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    """``@login_required`` (without ``functools.wraps``) above ``@quota.limit``: the view
    Flask registers is the decorator's wrapper, whose closure holds the limited view.
    The limit applies, and the missing ``wraps`` is said once."""
    quota = quota_app(app)

    @app.get("/secret", endpoint="secret")
    @no_wraps
    @quota.limit("3/minute")
    def secret() -> str:
        return "ok"

    with caplog.at_level(logging.WARNING, logger="flask_quota"):
        assert statuses(app, "/secret") == [200, 200, 200, 429]
    assert sum("functools.wraps" in r.getMessage() for r in caplog.records) == 1
    assert "3/minute" in line_of(routes_output(app), "/secret")


def test_a_view_calling_another_limited_function_is_not_limited_by_it(app: Flask) -> None:
    """Not every closure is a decorator's: a view that calls a limited function defined
    beside it (its closure holds it) is not limited by that function's limit."""
    quota = quota_app(app)

    @quota.limit("1/minute")
    def helper() -> str:
        return "ok"

    @app.get("/calls")
    def calls() -> str:
        return helper()

    assert statuses(app, "/calls") == [200] * 4


def test_a_limit_added_after_the_view_served_requests_applies(app: Flask) -> None:
    """Found in review: a limit added to a view after its first request was ignored
    (Flask-Limiter applies it). It applies from the next request on; so does an
    exemption."""
    quota = quota_app(app)

    @app.get("/late")
    def late() -> str:
        return "ok"

    assert statuses(app, "/late", 2) == [200, 200]
    quota.limit("3/minute")(app.view_functions["late"])
    assert statuses(app, "/late") == [200, 200, 200, 429]
    quota.exempt(app.view_functions["late"])
    assert statuses(app, "/late") == [200] * 4


def test_a_limit_on_a_class_that_is_no_view_is_refused_at_once(app: Flask) -> None:
    quota = quota_app(app)

    class NotAView:
        def get(self) -> str:
            return "ok"

    with pytest.raises(TypeError, match=r"flask\.views\.View"):
        quota.limit("3/minute")(NotAView)
    with pytest.raises(TypeError, match=r"flask\.views\.View"):
        quota.exempt(NotAView)
