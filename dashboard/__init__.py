"""The flask-quota operator dashboard: a blueprint mounted at ``QUOTA_DASHBOARD_URL``.

Live per-identity usage, bucket inspection and resets, plan, client and
override editing, and the audit log. Closed unless the app configures access
(``QUOTA_DASHBOARD_AUTH`` or ``QUOTA_DASHBOARD_USERS``); every POST carries a
CSRF token; no external assets.
"""

from __future__ import annotations

try:
    import flask_wtf  # noqa: F401  (the forms' CSRF protection)
except ImportError as exc:  # an optional dependency: say which extra brings it
    raise ImportError(
        "the flask-quota dashboard (QUOTA_DASHBOARD_URL) needs Flask-WTF: "
        "pip install 'flask-quota[dashboard]'"
    ) from exc

from .views import BLUEPRINT_NAME, make_blueprint

__all__ = ["BLUEPRINT_NAME", "make_blueprint"]
