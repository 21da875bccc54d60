"""``flask quota block``, ``unblock`` and ``blocks list``: callers refused outright for a while."""

from __future__ import annotations

from datetime import UTC, datetime

import click
from flask.cli import AppGroup, with_appcontext

from ..sql.inputs import parse_duration
from ..tools import blocks
from .common import (
    RAW,
    actor_option,
    app_state,
    caller_of,
    identity_argument,
    one_line_errors,
    refuse_if_memory,
    table,
    warn_if_memory,
)

__all__ = ["block", "blocks_cli", "unblock"]

blocks_cli = AppGroup("blocks", help="Callers refused outright for a while.")


@click.command("block", context_settings=RAW)
@with_appcontext
@identity_argument
@click.option("--ip", help="A client address: blocks the anonymous caller from it.")
@click.option("--for", "duration", required=True, help="How long, e.g. 10m, 12h, 7d.")
@click.option("--reason", default="", help="Why, for the audit log and the blocks list.")
@click.option(
    "--public/--private",
    default=False,
    show_default=True,
    help="Public: the blocked caller's 429 shows the reason too.",
)
@actor_option
@one_line_errors
def block(
    identity: str | None, ip: str | None, duration: str, reason: str, public: bool, actor: str
) -> None:
    """Refuse IDENTITY (or the anonymous caller of --ip) with 429 "blocked" for a while."""
    seconds = int(parse_duration(duration).total_seconds())
    caller = caller_of(identity, ip)
    refuse_if_memory("block", "Block on the Blocks page")
    for tag in blocks.block(app_state(), caller, seconds, reason, actor, public=public):
        click.echo(f"blocked {tag} for {seconds} s")


@click.command("unblock", context_settings=RAW)
@with_appcontext
@identity_argument
@click.option("--ip", help="A client address: unblocks the anonymous caller from it.")
@actor_option
@one_line_errors
def unblock(identity: str | None, ip: str | None, actor: str) -> None:
    """Lift the block of IDENTITY (or of --ip); every worker serves it again within 2 s."""
    caller = caller_of(identity, ip)
    refuse_if_memory("unblock", "Unblock on the Blocks page")
    lifted = blocks.unblock(app_state(), caller, actor)
    for tag in caller.tags:
        click.echo(f"unblocked {tag}" if tag in lifted else f"{tag} was not blocked")


@blocks_cli.command("list")
@one_line_errors
def blocks_list() -> None:
    """Show every live block: who, until when, by whom and why."""
    warn_if_memory()
    rows = [
        [
            b.tag,
            datetime.fromtimestamp(b.until, UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
            f"{b.remaining} s",
            b.by,
            b.reason or "-",
        ]
        for b in blocks.list_blocks(app_state())
    ]
    table(rows, ["CALLER", "UNTIL", "LEFT", "BY", "REASON"])
