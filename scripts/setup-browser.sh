#!/usr/bin/env bash
# Debian's chromium for the Prefect UI browser test (Playwright drives it; no browser download).
# Needs root and apt; where it cannot install, the UI test is skipped with that reason.
set -euo pipefail
command -v chromium >/dev/null && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "==> chromium is not installed and this user cannot apt-get it: the UI test will be skipped" >&2
  exit 0
fi
echo "==> installing Debian's chromium"
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
