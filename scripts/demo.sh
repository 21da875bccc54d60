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
# pip install -e takes seconds even when nothing changed: run it only when the package's
# metadata (dependencies, extras) changed since the last install, or it never ran here.
# The code itself needs no reinstall: an editable install reads it from this checkout.
stamp=.venv/.demo-install-stamp
wanted="$(cat setup.cfg pyproject.toml 2>/dev/null | sha256sum | cut -d' ' -f1) demo"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ] \
   || ! .venv/bin/python -c 'import importlib.util as u, sys
sys.exit(not all(u.find_spec(m) for m in ("flask_quota", "gunicorn")))' 2>/dev/null; then
  .venv/bin/python -m pip install -q -e '.[demo]'
  echo "$wanted" > "$stamp"
fi
# One worker with threads: the memory backend is per process, so one process
# keeps the demo's limits exact. Use Redis (QUOTA_STORAGE_URL) for more workers.
# The demo delivers webhooks to itself (wsgi.py): it reads the port from PORT.
export PORT="${PORT:-8000}"
exec .venv/bin/gunicorn --workers 1 --threads 8 --bind "127.0.0.1:${PORT}" wsgi:app
