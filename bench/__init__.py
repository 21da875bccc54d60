"""Side-by-side benchmarks: flask-quota vs Flask-Limiter vs the raw Redis floor.

Run ``bash bench/run.sh`` (or ``.venv/bin/python -m bench``); see ``bench/README.md``.
Not part of the test suite: it starts its own redis-server and gunicorn on
loopback ports, measures every candidate in the same run, and writes
``bench/results.md``.
"""
