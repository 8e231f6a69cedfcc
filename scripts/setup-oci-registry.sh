#!/usr/bin/env bash
# Debian's docker-registry (the CNCF distribution server) for the OCI registry tests (tests/oci_registry.py starts one
# of its own on loopback with a config of its own; the package's service is not started here). Needs root and apt;
# where it cannot install, those tests are skipped with that reason.
set -euo pipefail
command -v docker-registry >/dev/null && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "==> docker-registry is not installed and this user cannot apt-get it: the OCI registry tests will be skipped" >&2
  exit 0
fi
echo "==> installing Debian's docker-registry"
apt-get update -qq >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-registry >/dev/null
