#!/usr/bin/env bash
# The whole test suite on a fresh Debian/Ubuntu machine: installs what the tests
# need (redis-server, chromium for the dashboard's browser tests, a virtualenv
# with the test extras), lints, type-checks, then runs pytest: every test, the
# wheel's smoke test included (tests/test_wheel.py builds the sdist and wheel,
# runs twine check and installs the wheel alone in fresh venvs). Then nox runs
# the fast part on the other supported Pythons (noxfile.py). Extra arguments go
# to the main pytest run. With CI=true, a missing PostgreSQL is an error.
set -euo pipefail
cd "$(dirname "$0")/.."
ci=false; case "${CI:-}" in 1|true|TRUE|True) ci=true;; esac

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
  elif $ci; then
    echo "!!! no PostgreSQL reachable, and CI requires the PostgreSQL variants: failing" >&2
    exit 1
  else
    echo "!!! no PostgreSQL reachable: the PostgreSQL variants of the SQL tests will be SKIPPED"
  fi
fi

started=$SECONDS
echo "== ruff"; .venv/bin/ruff check .
echo "== mypy"; .venv/bin/mypy
echo "== pytest (all tests, $(.venv/bin/python -V))"
.venv/bin/python -m pytest "$@"
echo "== main run: $((SECONDS - started)) s"

# The fast part on every other supported Python (the main run covered its own).
main=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
others=$(.venv/bin/nox -l --json | .venv/bin/python -c '
import json, sys
print(" ".join(s["python"] for s in json.load(sys.stdin) if s["python"] != sys.argv[1]))
' "$main")
echo "== nox: the fast tests on Python $others"
nox_started=$SECONDS
# shellcheck disable=SC2086  # one argument per Python version
.venv/bin/nox -p $others -- -q
echo "== nox: $((SECONDS - nox_started)) s; total $((SECONDS - started)) s"
