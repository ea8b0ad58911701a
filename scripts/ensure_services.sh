#!/usr/bin/env bash
# Make sure PostgreSQL and Redis answer on 127.0.0.1, starting them if they are down,
# and that Debian's Chromium is installed for the browser tests. Fails loudly otherwise.
set -uo pipefail

pg_up() { pg_isready -h 127.0.0.1 -p 5432 -U postgres -q 2>/dev/null; }
redis_up() { [ "$(redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null)" = "PONG" ]; }

wait_for() {  # name, check function
  for _ in $(seq 1 40); do "$2" && return 0; sleep 0.5; done
  echo "ERROR: $1 is not reachable on 127.0.0.1 even after trying to start it." >&2
  exit 1
}

if ! pg_up; then
  echo "PostgreSQL is down; starting it."
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
  wait_for PostgreSQL pg_up
fi
if ! redis_up; then
  echo "Redis is down; starting it."
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no || true
  wait_for Redis redis_up
fi
echo "PostgreSQL and Redis answer on 127.0.0.1."

if ! command -v chromium >/dev/null 2>&1; then
  echo "Installing Debian's chromium for the browser tests."
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q && apt-get install -y -q chromium || { echo "ERROR: could not install chromium." >&2; exit 1; }
fi
