"""``flask quota webhooks list`` and ``retry``: the outbox of webhook events, read and nudged."""

from __future__ import annotations

import click
from flask.cli import AppGroup

from ..sql.errors import AdminError
from ..webhooks import EventInfo, event_info, list_events, retry
from .common import RAW, actor_option, admin_for, app_state, app_store, one_line_errors, table, when

__all__ = ["webhooks_cli"]

webhooks_cli = AppGroup("webhooks", help="Webhook events: sent, waiting, or given up on.")

_ERROR_SHOWN = 60  # characters of an event's last error in the table


def _limit(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise AdminError(f"--limit must be a whole number of at least 1, not {text!r}")
    return number


def _row(event: EventInfo) -> list[str]:
    if event.status == "pending":
        next_or_done = when(event.next_attempt_at)
    elif event.status == "delivered":
        next_or_done = when(event.delivered_at)
    else:
        next_or_done = "-"
    error = event.last_error or "-"
    if len(error) > _ERROR_SHOWN:
        error = error[: _ERROR_SHOWN - 3] + "..."
    return [
        event.id,
        event.type,
        event.status,
        str(event.attempts),
        when(event.created),
        next_or_done,
        " ".join(error.split()),  # one line per event, whatever the receiver answered
    ]


@webhooks_cli.command("list")
@click.option("--failed", is_flag=True, help="Only the events given up on after 24 h.")
@click.option("--limit", default="50", show_default=True, help="How many, newest first.")
@one_line_errors
def webhooks_list(failed: bool, limit: str) -> None:
    """Show the newest webhook events: status, attempts, when next tried or delivered."""
    count = _limit(limit)
    store = app_store()
    store.ensure_ready()
    events = list_events(store.engine, failed_only=failed, limit=count)
    table(
        (_row(event) for event in events),
        ["ID", "TYPE", "STATUS", "ATTEMPTS", "CREATED", "NEXT/DELIVERED", "LAST ERROR"],
    )


@webhooks_cli.command("retry", context_settings=RAW)
@click.argument("event_id", metavar="ID")
@actor_option
@one_line_errors
def webhooks_retry(event_id: str, actor: str) -> None:
    """Send event ID again at once (a failed one, or a pending one waiting out its backoff)."""
    store = app_store()
    admin = admin_for(actor)  # an empty --actor is refused before anything is read
    store.ensure_ready()
    event = event_info(store.engine, event_id.strip())  # an unknown id: nothing audited
    if event.status == "delivered":
        raise AdminError(
            f"{event.id} was delivered at {when(event.delivered_at)}: nothing to retry"
        )
    before = {"status": event.status, "attempts": event.attempts}
    with admin.audited("webhook.retry", event.id, before, {"status": "pending"}):
        if not retry(store.engine, event.id):
            raise AdminError(f"{event.id} was delivered meanwhile: nothing to retry")
    click.echo(f"{event.id} ({event.type}) is due now")
    if app_state().settings.webhook_url is None:
        click.echo(
            "warning: QUOTA_WEBHOOK_URL is not set here, so no sender runs in this app; "
            "the servers that have it send the event",
            err=True,
        )
