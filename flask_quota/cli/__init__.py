"""``flask quota ...``: plans, clients, overrides, usage, resets and routes from the shell.

Every change is written to the audit log under ``--actor`` (default: ``$USER``)
and reaches every running worker within ``QUOTA_SYNC_INTERVAL`` plus a reload.
Bad input exits with status 1 and a one-line message, having changed nothing.
One module per topic; this one assembles the ``quota`` group.
"""

from __future__ import annotations

from flask.cli import AppGroup

from .blocks import block, blocks_cli, unblock
from .clients import clients_cli
from .credits import credits_cli
from .db import db_cli
from .networks import networks_cli
from .overrides import overrides_cli
from .plans import plans_cli
from .routes import routes
from .usage import reset, usage
from .webhooks import webhooks_cli

__all__ = ["quota_cli"]

quota_cli = AppGroup(
    "quota",
    help=(
        "Manage flask-quota plans, clients, overrides, credits, blocks, networks and "
        "webhooks; see usage; list the routes' limits."
    ),
)
for command in (
    plans_cli,
    clients_cli,
    credits_cli,
    overrides_cli,
    blocks_cli,
    networks_cli,
    db_cli,
    webhooks_cli,
    usage,
    reset,
    block,
    unblock,
    routes,
):
    quota_cli.add_command(command)
