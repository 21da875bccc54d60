"""An app that counts usage on a shared backend (tests/test_usage_shared.py).

The test builds one in its own process with ``app_on``; ``python -m tests.apps.usage
URL FOLDER PREFIX ADDRESS`` builds another in a second process, serves one request
from ADDRESS and flushes its usage.
"""

from __future__ import annotations

import sys
from pathlib import Path

from flask import Flask

from flask_quota import Quota

__all__ = ["app_on"]


def app_on(url: str, folder: Path, prefix: str) -> Flask:
    """An app on storage ``url`` under key ``prefix``, its SQL and instance in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    app = Flask(__name__, instance_path=str(folder))
    app.secret_key = "test"
    app.config.update(
        QUOTA_STORAGE_URL=url,
        QUOTA_STORAGE_TIMEOUT=2,
        QUOTA_KEY_PREFIX=prefix,
        QUOTA_DASHBOARD_URL="/quota",
        QUOTA_DATABASE_URL=f"sqlite:///{folder}/quota.sqlite3",
        QUOTA_PLANS={"free": {"user": "100/hour"}},
    )
    Quota(app)
    app.add_url_rule("/items", "items", lambda: "ok")
    return app


if __name__ == "__main__":
    url, folder, prefix, address = sys.argv[1:]
    other = app_on(url, Path(folder), prefix)
    served = other.test_client().get("/items", environ_base={"REMOTE_ADDR": address})
    assert served.status_code == 200, served.status_code
    other.extensions["quota"].usage.flush()
