#!/usr/bin/env bash
# The benchmarks in one command: install the [bench] extra (Flask-Limiter,
# gunicorn) and hiredis into .venv, then run `python -m bench`, which writes
# bench/results.md. Extra arguments go to it: --quick, --only latency ...
set -euo pipefail
cd "$(dirname "$0")/.."

command -v redis-server >/dev/null || {
  echo "bench: redis-server is needed (apt-get install redis-server)" >&2
  exit 1
}
command -v wrk >/dev/null ||
  echo "bench: wrk not found, throughput uses a Python load generator (apt-get install wrk)" >&2

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q -e '.[bench,hiredis]'
exec .venv/bin/python -m bench "$@"
