#!/usr/bin/env bash
# The whole test suite on a fresh Debian/Ubuntu machine: installs what the tests
# need (redis-server, chromium for the dashboard's browser tests, a virtualenv
# with the test extras), lints, type-checks, then runs pytest. Extra arguments
# go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
[ -x /usr/bin/chromium ] || missing+=(chromium)
python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} with apt-get"
  sudo_ apt-get update -qq
  sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[test]'

if [ -z "${QUOTA_TEST_DATABASE_URL:-}" ]; then
  if url=$(bash scripts/postgres.sh); then
    export QUOTA_TEST_DATABASE_URL="$url"
    echo "PostgreSQL for the SQL tests: $url"
  else
    echo "!!! no PostgreSQL reachable: the PostgreSQL variants of the SQL tests will be SKIPPED"
  fi
fi

echo "== ruff"; .venv/bin/ruff check .
echo "== mypy"; .venv/bin/mypy
echo "== pytest"; exec .venv/bin/python -m pytest "$@"
