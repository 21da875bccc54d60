"""gunicorn settings for metrics under several workers, as the docs show:
``gunicorn --config python:tests.apps.gunicorn_metrics``."""

from flask_quota.metrics import gunicorn_child_exit as child_exit

__all__ = ["child_exit"]
