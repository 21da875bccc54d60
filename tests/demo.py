"""The demo (wsgi.py) in this process, its background work done before a test goes on.

Importing ``wsgi`` builds its module-level app, and every app it builds outside a
``flask`` command starts a thread that makes the demo clients and prints their keys to
stderr. Left running, that print lands in whatever a later test on the same pytest-xdist
worker is capturing (a CLI runner's output, say), so each is joined here.
"""

from __future__ import annotations

import threading
from typing import Any

from flask import Flask

DEMO_THREAD = "demo"  # wsgi.py's name for it


def demo_app(config: dict[str, Any] | None = None) -> Flask:
    """``wsgi.create_app(config)``, once every demo thread so far has finished."""
    import wsgi

    app = wsgi.create_app(config)
    for thread in threading.enumerate():
        if thread.name == DEMO_THREAD:
            thread.join(timeout=30)
    return app
