"""The SQL layer's own errors (operators' refused changes among them), and the one-line
text every caller shows for a database error."""

from __future__ import annotations

__all__ = [
    "PLANS_READ_ONLY",
    "AdminError",
    "ChangeConflict",
    "KeysUnavailable",
    "PlansReadOnly",
    "StaleEdit",
    "TablesMissing",
    "database_error",
    "one_line",
    "sql_reason",
]


class TablesMissing(RuntimeError):
    """The host's database has no quota tables yet."""


class KeysUnavailable(RuntimeError):
    """An API key cannot be checked now: no snapshot of the clients has loaded yet.

    The extension then serves the request as anonymous, and never refuses it with
    401 (``QUOTA_REJECT_UNKNOWN_KEYS``): the key may well be a paying client's.
    """


class AdminError(ValueError):
    """Bad input or an unknown name: a one-line message, nothing changed."""


class ChangeConflict(AdminError):
    """Another writer changed the same rows at the same moment, twice: nothing changed."""


class StaleEdit(ChangeConflict):
    """The edit was based on a state of the plan that someone else has changed since
    (``based_on`` no longer matches): nothing changed; reload and try again."""


class PlansReadOnly(AdminError):
    """``QUOTA_PLANS_SOURCE=config``: the plans follow ``QUOTA_PLANS``, not operators."""


PLANS_READ_ONLY = (
    "plans are read-only here: QUOTA_PLANS_SOURCE=config applies QUOTA_PLANS to the "
    "database at every start. Edit QUOTA_PLANS and restart, or set "
    "QUOTA_PLANS_SOURCE=database to edit plans here"
)


def sql_reason(exc: BaseException) -> str:
    """What a database error says, on one line: the driver's own message (``orig``)
    when there is one, its first line (a driver's message may span several), or ""."""
    reason = str(getattr(exc, "orig", None) or exc).strip()
    return reason.splitlines()[0] if reason else ""


def database_error(exc: BaseException) -> str:
    """What a command prints when the database failed it: ``database error: <reason>``."""
    return f"database error: {sql_reason(exc)}"


def one_line(exc: BaseException) -> str:
    """An error as one short line with its type, for logs and the sync status."""
    return f"{type(exc).__name__}: {sql_reason(exc)}"[:300]
