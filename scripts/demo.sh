#!/usr/bin/env bash
# Run the demo API (wsgi.py) on the embedded defaults: memory storage, no services.
# QUOTA_* environment variables configure it; PORT picks the port (default 8000).
# A QUOTA_DATABASE_URL that is down at boot does not stop it: the log says so, and
# the built-in plans (or QUOTA_PLANS) apply until the database answers.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import ensurepip' 2>/dev/null; then
  if [ "$(id -u)" -eq 0 ]; then apt-get update -qq && apt-get install -y -qq python3-venv
  else sudo apt-get update -qq && sudo apt-get install -y -qq python3-venv; fi
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q -e '.[demo]'
# One worker with threads: the memory backend is per process, so one process
# keeps the demo's limits exact. Use Redis (QUOTA_STORAGE_URL) for more workers.
exec .venv/bin/gunicorn --workers 1 --threads 8 --bind "127.0.0.1:${PORT:-8000}" wsgi:app
