#!/usr/bin/env bash
# Print the URL of a MariaDB (or MySQL) the SQL tests may use (they create and
# drop databases of their own next to it). Uses the server on 127.0.0.1:3306 when
# one answers; otherwise installs and starts Debian's mariadb-server (root only),
# creates the database `test` and lets root in over TCP without a password.
# Exits non-zero, printing nothing, when there is none to be had.
set -uo pipefail
cd "$(dirname "$0")/.."
url="mysql+pymysql://root@127.0.0.1:3306/test"

client() { command -v mariadb || command -v mysql; }

answers() {
  local bin
  if bin=$(client); then
    "$bin" --protocol=tcp -h 127.0.0.1 -P 3306 -u root --connect-timeout=3 -e 'select 1' test \
      >/dev/null 2>&1 && return 0
  fi
  # No client program (e.g. a server in a container): ask with the test extra's PyMySQL.
  [ -x .venv/bin/python ] && .venv/bin/python - >/dev/null 2>&1 <<'EOF'
import pymysql
pymysql.connect(host="127.0.0.1", port=3306, user="root", password="", database="test",
                connect_timeout=3).close()
EOF
}

if answers; then echo "$url"; exit 0; fi
[ "$(id -u)" -eq 0 ] || exit 1

if ! command -v mariadbd >/dev/null && ! command -v mysqld >/dev/null; then
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server >&2 || exit 1
fi
# No systemd here: Debian's init script, else the server's own wrapper in the background.
if ! service mariadb start >&2 2>&1; then
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null
  (mysqld_safe --user=mysql >/dev/null 2>&1 &)
fi
bin=$(client) || exit 1
for _ in $(seq 30); do
  "$bin" -u root -e 'select 1' >/dev/null 2>&1 && break  # the unix socket, as root
  sleep 1
done
# Debian's root@localhost logs in by unix socket only: the tests come over TCP.
"$bin" -u root >&2 <<'SQL' || exit 1
CREATE DATABASE IF NOT EXISTS test CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
FLUSH PRIVILEGES;
SQL
if answers; then echo "$url"; exit 0; fi
exit 1
