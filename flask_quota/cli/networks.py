"""``flask quota networks deny|allow|list|remove``: operators' rules for whole networks.

A denied network's requests get 403; an allowed network's skip the per-IP global tier
(their own budgets still apply). One rule per network: ``deny`` or ``allow`` of a network
that has one replaces it. Rows in SQL, audited, applied by every worker within
``QUOTA_SYNC_INTERVAL`` (no storage call per request).
"""

from __future__ import annotations

import click
from flask.cli import AppGroup

from ..core.networks import ALLOW, DENY
from ..sql.inputs import lifetime
from .common import RAW, actor_option, admin_for, one_line_errors, table, when

__all__ = ["networks_cli"]

networks_cli = AppGroup(
    "networks", help="Networks (CIDR) denied (403) or allowed (no per-IP global tier)."
)

_FOR_HELP = "How long: seconds (600) or 30m, 12h, 7d; default: until removed."
_REASON_HELP = "Why, for the audit log and `networks list`."


def _set(cidr: str, action: str, duration: str | None, reason: str, actor: str) -> None:
    expires_in = lifetime(duration) if duration is not None else None
    info = admin_for(actor).set_network(cidr, action, expires_in=expires_in, reason=reason)
    until = f"until {when(info.expires_at)}" if info.expires_at else "until removed"
    done = "denied" if info.action == DENY else "allowed"
    click.echo(f"{done} {info.cidr} {until}")


@networks_cli.command("deny", context_settings=RAW)
@click.argument("cidr")
@click.option("--for", "duration", help=_FOR_HELP)
@click.option("--reason", default="", help=_REASON_HELP)
@actor_option
@one_line_errors
def networks_deny(cidr: str, duration: str | None, reason: str, actor: str) -> None:
    """Refuse every request from CIDR (e.g. 203.0.113.0/24, 2001:db8::/32, or one
    address) with 403, replacing the network's earlier rule."""
    _set(cidr, DENY, duration, reason, actor)


@networks_cli.command("allow", context_settings=RAW)
@click.argument("cidr")
@click.option("--for", "duration", help=_FOR_HELP)
@click.option("--reason", default="", help=_REASON_HELP)
@actor_option
@one_line_errors
def networks_allow(cidr: str, duration: str | None, reason: str, actor: str) -> None:
    """Let requests from CIDR skip the per-IP global tier (their own budgets still
    apply), replacing the network's earlier rule."""
    _set(cidr, ALLOW, duration, reason, actor)


@networks_cli.command("list")
@one_line_errors
def networks_list() -> None:
    """Show every network rule in force: network, action, until when, why, by whom, since."""
    table(
        (
            [
                n.cidr,
                n.action,
                when(n.expires_at) if n.expires_at else "until removed",
                n.reason or "-",
                n.created_by,
                when(n.created_at),
            ]
            for n in admin_for("cli").networks()
        ),
        ["NETWORK", "ACTION", "EXPIRES", "REASON", "BY", "CREATED"],
    )


@networks_cli.command("remove", context_settings=RAW)
@click.argument("cidr")
@actor_option
@one_line_errors
def networks_remove(cidr: str, actor: str) -> None:
    """Delete the rule of CIDR: its requests are limited as any others' again."""
    info = admin_for(actor).remove_network(cidr)
    if info is not None:  # always: without missing_ok, a missing rule raised AdminError
        click.echo(f"removed the {info.action} rule of {info.cidr}")
