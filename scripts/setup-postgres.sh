#!/usr/bin/env bash
# Debian's PostgreSQL for the Prefect-on-Postgres worker tests (tests/postgres.py starts a cluster of its own
# in a temporary directory on loopback; nothing is started here). Needs root and apt; where it cannot
# install, those tests are skipped with that reason.
set -euo pipefail
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && exit 0
command -v initdb >/dev/null && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "==> PostgreSQL is not installed and this user cannot apt-get it: the worker tests will be skipped" >&2
  exit 0
fi
echo "==> installing Debian's postgresql"
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
