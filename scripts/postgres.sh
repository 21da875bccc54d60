#!/usr/bin/env bash
# Print the URL of a PostgreSQL the SQL tests may use (they create and drop
# databases of their own next to it). Uses the server on 127.0.0.1:5432 when
# one answers; otherwise installs and starts Debian's postgresql (root only).
# Exits non-zero, printing nothing, when there is none to be had.
set -uo pipefail
url_trust="postgresql://postgres@127.0.0.1:5432/test"
url_pw="postgresql://postgres:postgres@127.0.0.1:5432/test"

answers() { command -v psql >/dev/null && PGCONNECT_TIMEOUT=3 psql "$1" -Atqc 'select 1' >/dev/null 2>&1; }

for url in "$url_trust" "$url_pw"; do
  if answers "$url"; then echo "$url"; exit 0; fi
done
[ "$(id -u)" -eq 0 ] || exit 1

if ! command -v pg_ctlcluster >/dev/null; then
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2 || exit 1
fi
version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
[ -n "$version" ] || exit 1
pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 2>&1 || true
for _ in $(seq 30); do
  su postgres -c "psql -Atqc 'select 1'" >/dev/null 2>&1 && break
  sleep 1
done
# A fresh cluster trusts only local peers: give the postgres role a password for TCP.
su postgres -c "psql -qc \"ALTER USER postgres PASSWORD 'postgres'\"" >&2 || exit 1
su postgres -c "createdb test" >/dev/null 2>&1 || true
for url in "$url_trust" "$url_pw"; do
  if answers "$url"; then echo "$url"; exit 0; fi
done
exit 1
