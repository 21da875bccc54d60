"""A sliding log too large to decide cheaply is refused when it is written, not only
when QUOTA_PLANS is read: by the CLI, by overrides and by a plans import.

(The rule itself, ``algorithms.unfit``, and the configuration-time refusals are
pinned in tests/test_log_bound.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flask import Flask

from flask_quota import Quota
from flask_quota.sql.admin import AdminError, QuotaAdmin


def admin_app(app: Flask, tmp_path: Path, **config: object) -> QuotaAdmin:
    app.config.update(
        QUOTA_DATABASE_URL=f"sqlite:///{tmp_path / 'quota.sqlite3'}",
        QUOTA_PLANS={"free": {"user": "100/minute"}},
        **config,
    )
    quota = Quota(app)
    assert quota is not None
    return QuotaAdmin(app.extensions["quota"].sql, actor="test")


def test_plans_set_refuses_a_huge_log_and_changes_nothing(app: Flask, tmp_path: Path) -> None:
    """`plans set free user 1000000/hour --algorithm sliding_window_log` exits non-zero
    naming a fitting algorithm, and the plan keeps its old rate."""
    admin_app(app, tmp_path)
    runner = app.test_cli_runner()
    result = runner.invoke(
        args=["quota", "plans", "set", "free", "user", "1000000/hour",
              "--algorithm", "sliding_window_log"]
    )  # fmt: skip
    assert result.exit_code != 0
    assert "sliding_window_counter" in result.output
    listed = runner.invoke(args=["quota", "plans", "list"]).output
    assert "100/minute" in listed and "1000000/hour" not in listed


def test_the_default_algorithm_is_checked_too(app: Flask, tmp_path: Path) -> None:
    """With QUOTA_ALGORITHM=sliding_window_log, a limit without its own algorithm is held
    to the same bound."""
    admin = admin_app(app, tmp_path, QUOTA_ALGORITHM="sliding_window_log")
    with pytest.raises(AdminError, match="QUOTA_ALGORITHM"):
        admin.set_plan_limit("free", "user", "50000/hour")
    admin.set_plan_limit("free", "user", "500/hour")  # within the bound: fine


def test_an_override_is_held_to_its_limits_algorithm(app: Flask, tmp_path: Path) -> None:
    """An override on a sliding-log limit cannot raise it past the bound."""
    admin = admin_app(app, tmp_path)
    admin.set_plan_limit("free", "user", "100/hour", algorithm="sliding_window_log")
    client, _key = admin.create_client("acme", "free")
    with pytest.raises(AdminError, match="override"):
        admin.add_override(client.id, "user", "2000000/hour")
    assert admin.add_override(client.id, "user", "900/hour").rate == "900/hour"


def test_an_import_is_checked_against_quota_algorithm(app: Flask, tmp_path: Path) -> None:
    """`plans import` with QUOTA_ALGORITHM=sliding_window_log refuses a huge rate."""
    admin_app(app, tmp_path, QUOTA_ALGORITHM="sliding_window_log")
    plans = tmp_path / "plans.json"
    plans.write_text(json.dumps({"free": {"user": "1000000/hour"}}))
    result = app.test_cli_runner().invoke(args=["quota", "plans", "import", str(plans)])
    assert result.exit_code != 0
    assert "sliding_window_counter" in result.output
