"""Small Flask apps that tests serve with gunicorn."""

from __future__ import annotations

import os

from flask import Flask, Response, jsonify

from flask_quota import Quota

__all__ = ["name_the_worker"]


def name_the_worker(app: Flask, quota: Quota) -> None:
    """``/healthz`` (exempt) answers the worker's pid, as ``tests.servers.wait_for_workers``
    reads it, and every response names its worker in ``X-Worker``."""

    @app.get("/healthz")
    @quota.exempt
    def healthz() -> Response:
        return jsonify(worker=os.getpid())

    @app.after_request
    def worker(response: Response) -> Response:
        response.headers["X-Worker"] = str(os.getpid())
        return response
