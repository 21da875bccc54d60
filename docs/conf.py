"""Sphinx configuration of the flask-quota docs.

Build: ``sphinx-build -W --keep-going -b html docs docs/_build/html`` (warnings
are errors). The configuration reference and the API reference are generated
from the code, so they cannot drift from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# The checkout's own package, not whatever flask_quota is installed elsewhere.
sys.path[:0] = [str(HERE.parent), str(HERE / "_ext")]

project = "flask-quota"
author = "The flask-quota authors"
copyright = "the flask-quota authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "quota_docs",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# Markdown: anchors for headings down to ###, so pages can link to sections.
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": False}

html_theme = "furo"
html_title = "flask-quota"
html_static_path: list[str] = []
