"""``quota.limited(...)``: a limit for code that is not a view (a CLI command, a worker)."""

from __future__ import annotations

import pytest
from flask import Flask, request

from flask_quota import Identity, Quota, QuotaExceeded
from flask_quota.storage import MemoryStorage, Storage
from flask_quota.testing import FrozenClock
from tests.backends import backend  # noqa: F401  (the fixture)

Backend = tuple[Storage, FrozenClock]


def test_two_sends_per_phone_in_an_app_context(app: Flask, backend: Backend) -> None:  # noqa: F811
    """Two sends, then QuotaExceeded; another phone is independent; a minute later
    the first may send again. On memory and on Redis."""
    storage, clock = backend
    quota = Quota(app, storage=storage)
    sent: list[str] = []

    def send(phone: str) -> None:
        with quota.limited("2/minute", key=phone):
            sent.append(phone)

    with app.app_context():
        send("+100")
        send("+100")
        with pytest.raises(QuotaExceeded) as denied:
            send("+100")
        send("+200")
        clock.advance(60)
        send("+100")
    assert sent == ["+100", "+100", "+200", "+100"]
    assert denied.value.limit == 2
    assert denied.value.tier == "endpoint"


def test_as_a_decorator_on_an_inner_function(app: Flask, clock: FrozenClock) -> None:
    quota = Quota(app, storage=MemoryStorage(clock))

    @quota.limited("1/minute", resource="reports", key="nightly")
    def report() -> str:
        return "done"

    with app.app_context():
        assert report() == "done"
        with pytest.raises(QuotaExceeded):
            report()


def test_in_a_request_the_caller_owns_the_bucket(app: Flask, clock: FrozenClock) -> None:
    """Inside a request the caller's identity is the key; only that limit is checked: the
    plan's user tier is not charged, and a denial is the request's 429."""
    app.config.update(QUOTA_PLANS={"free": {"user": "100/minute"}})
    quota = Quota(app, storage=MemoryStorage(clock))

    @quota.identity_loader
    def who() -> Identity:
        return Identity(id=request.args["who"], plan="free")

    @app.get("/sms")
    @quota.exempt
    def sms() -> str:
        with quota.limited("1/minute", resource="send_sms"):
            return "sent"

    http = app.test_client()
    assert http.get("/sms?who=ann").status_code == 200
    denied = http.get("/sms?who=ann")
    assert denied.status_code == 429
    assert denied.get_json()["resource"] == "send_sms"
    assert http.get("/sms?who=bob").status_code == 200
    with app.app_context():
        user = [b for b in quota.peek("ann") if b.tier == "user"]
    assert user[0].remaining == 100


def test_outside_a_request_key_is_required(app: Flask) -> None:
    quota = Quota(app, storage=MemoryStorage())
    limit = quota.limited("1/minute", resource="jobs")
    with app.app_context(), pytest.raises(RuntimeError, match="key="), limit:
        pass


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("lots",), ValueError),
        (("1/minute",), None),
    ],
)
def test_bad_arguments_are_refused_at_once(app: Flask, args: tuple[str], error: object) -> None:
    quota = Quota(app, storage=MemoryStorage())
    if error is None:
        with pytest.raises(ValueError, match="resource"):
            quota.limited(*args, resource="no spaces")
        with pytest.raises(TypeError, match="key"):
            quota.limited(*args, key=5)  # type: ignore[arg-type]
    else:
        with pytest.raises(ValueError):
            quota.limited(*args)


def test_a_callable_rate_needs_a_resource_and_a_bad_answer_is_named(app: Flask) -> None:
    """A callable rate's bucket is named by ``resource`` (its answers may change); an
    answer that is no rate is refused on entry, naming it."""
    quota = Quota(app, storage=MemoryStorage())
    with pytest.raises(ValueError, match="resource="):
        quota.limited(lambda: "1/minute")
    limit = quota.limited(lambda: "often", resource="jobs", key="k")
    with app.app_context(), pytest.raises(ValueError, match="'often'"), limit:
        pass


def test_the_plan_sets_the_rate_and_switching_off_checks_nothing(
    app: Flask, clock: FrozenClock
) -> None:
    """A plan's rate for the resource wins over the literal one (the default plan's
    outside a request); with QUOTA_ENABLED False nothing is checked."""
    app.config.update(QUOTA_PLANS={"free": {"resources": {"send_sms": "3/minute"}}})
    quota = Quota(app, storage=MemoryStorage(clock))
    with app.app_context():
        for _ in range(3):
            with quota.limited("1/minute", resource="send_sms", key="+1"):
                pass
        with pytest.raises(QuotaExceeded), quota.limited("1/minute", resource="send_sms", key="+1"):
            pass
    off = Flask(__name__, instance_path=app.instance_path + "-off")
    off.config.update(QUOTA_ENABLED=False)
    quiet = Quota(off, storage=MemoryStorage(clock))
    with off.app_context():
        for _ in range(3):
            with quiet.limited("1/minute", key="+1"):
                pass
