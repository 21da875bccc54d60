"""A Sphinx directive that renders the configuration reference from the code.

``.. quota-config::`` (in Markdown: a ``{quota-config}`` fence) becomes a table
of ``flask_quota.settings.reference()``: every ``QUOTA_*`` key with its default
and meaning. The table is built from the same rows ``init_app`` documents, so
it cannot drift from the settings the code reads.
"""

from __future__ import annotations

import re
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive

from flask_quota.settings import reference

# The meanings use reStructuredText's ``literal`` markup and nothing else.
_LITERAL = re.compile(r"``(.+?)``")


def _inline(text: str) -> list[nodes.Node]:
    """``text`` with its ``literal`` spans as literal nodes, the rest as plain text."""
    parts: list[nodes.Node] = []
    for i, piece in enumerate(_LITERAL.split(text)):
        if piece:
            parts.append(nodes.literal(piece, piece) if i % 2 else nodes.Text(piece))
    return parts


def _row(*cells: list[nodes.Node]) -> nodes.row:
    row = nodes.row()
    for cell in cells:
        entry = nodes.entry()
        entry += nodes.paragraph("", "", *cell)
        row += entry
    return row


class QuotaConfig(Directive):
    """The table of every configuration key: key, default, meaning."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        group = nodes.tgroup(cols=3)
        for width in (28, 14, 58):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        head += _row(*([nodes.Text(title)] for title in ("key", "default", "meaning")))
        group += head
        body = nodes.tbody()
        for key, default, meaning in reference():
            target = nodes.target("", "", ids=[nodes.make_id(key)])
            body += _row(
                [target, nodes.literal(key, key)],
                [nodes.literal(default, default)],
                _inline(meaning),
            )
        group += body
        table = nodes.table(classes=["quota-config"])
        table += group
        return [table]


def setup(app: Any) -> dict[str, Any]:
    """Register the ``quota-config`` directive."""
    app.add_directive("quota-config", QuotaConfig)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
