"""The configuration reference in ``docs/configuration.md``, generated from the code.

The table of every ``QUOTA_*`` key (key, default, meaning) is written into the
Markdown file itself, between two marker comments, from
``flask_quota.settings.reference()``: the same rows ``init_app``'s docstring is
built from. So the page lists every key on GitHub as in the Sphinx site.

Regenerate it after changing a key::

    .venv/bin/python docs/_ext/quota_docs.py          # rewrites docs/configuration.md
    .venv/bin/python docs/_ext/quota_docs.py --check  # exit status 1 when it is stale

As a Sphinx extension (``docs/conf.py``), it fails a ``-W`` build whose table is
stale; ``tests/test_docs_drift.py`` fails too.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CONFIGURATION = HERE.parent / "configuration.md"
REGENERATE = "python docs/_ext/quota_docs.py"
BEGIN = (
    "<!-- quota-config: generated from flask_quota.settings.reference() by "
    f"`{REGENERATE}`; edit the code, not this table -->"
)
END = "<!-- /quota-config -->"

# The meanings use reStructuredText's ``literal`` markup and nothing else.
_LITERAL = re.compile(r"``(.+?)``")


def _cell(text: str) -> str:
    """One table cell: ``literal`` spans as Markdown code, pipes escaped."""
    return _LITERAL.sub(r"`\1`", text).replace("|", "\\|")


def config_table() -> str:
    """The Markdown table of every configuration key, in documentation order."""
    sys.path.insert(0, str(HERE.parent.parent))  # this checkout's flask_quota
    try:
        from flask_quota.settings import reference
    finally:
        sys.path.pop(0)
    lines = ["| key | default | meaning |", "|---|---|---|"]
    for key, default, meaning in reference():
        lines.append(f"| `{key}` | `{_cell(default)}` | {_cell(meaning)} |")
    return "\n".join(lines)


def render(text: str) -> str:
    """``text`` with the table between the markers replaced by the current one."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{CONFIGURATION.name} lacks the markers {BEGIN!r} ... {END!r}")
    return text[: start + len(BEGIN)] + "\n\n" + config_table() + "\n\n" + text[end:]


def stale(path: Path = CONFIGURATION) -> bool:
    """True when ``path``'s table differs from the one the code gives."""
    text = path.read_text(encoding="utf-8")
    return render(text) != text


def main(argv: list[str]) -> int:
    """Rewrite the table, or with ``--check`` only say whether it is stale."""
    if argv == ["--check"]:
        if stale():
            print(f"{CONFIGURATION} is stale: run `{REGENERATE}`", file=sys.stderr)
            return 1
        return 0
    if argv:
        print(f"usage: {REGENERATE} [--check]", file=sys.stderr)
        return 2
    text = CONFIGURATION.read_text(encoding="utf-8")
    CONFIGURATION.write_text(render(text), encoding="utf-8")
    return 0


def _check_at_build(app: Any) -> None:
    from sphinx.util import logging

    if stale():
        logging.getLogger(__name__).warning(
            "docs/configuration.md's key table is stale: run `%s`", REGENERATE
        )


def setup(app: Any) -> dict[str, Any]:
    """Warn (an error under ``-W``) when the configuration table is stale."""
    app.connect("builder-inited", _check_at_build)
    return {"version": "2", "parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
