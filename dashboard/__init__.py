"""The flask-quota operator dashboard: a blueprint mounted at ``QUOTA_DASHBOARD_URL``.

Live per-identity usage, bucket inspection, resets and blocks, network rules, plan,
client and override editing, and the audit log. Closed unless the app configures access
(``QUOTA_DASHBOARD_AUTH`` or ``QUOTA_DASHBOARD_USERS``); every POST carries a
CSRF token bound to the dashboard's own cookie (see ``session``); no external assets.
"""

from __future__ import annotations

from .views import BLUEPRINT_NAME, make_blueprint

__all__ = ["BLUEPRINT_NAME", "make_blueprint"]
