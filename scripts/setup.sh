#!/usr/bin/env bash
# Set up the pipeline's environment in .venv (idempotent): torch first (the CPU wheel; unpinned, pip would
# fetch a multi-GB CUDA build), then enginesmith with its quantisation, Prefect and dev extras.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${ENGINESMITH_VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
stamp="$VENV/.enginesmith-setup"
# The quantization extra's versions, held by the pins its runtime lists: an unpinned dependency (accelerate) would
# otherwise move with PyPI and break the pins test (tests/test_runtimes.py) on the next fresh machine.
PINS=enginesmith/catalogue/runtimes/modelopt.txt
want="$(sha256sum pyproject.toml scripts/setup.sh "$PINS" | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "==> $VENV is up to date"
  exit 0
fi
echo "==> installing torch 2.13.0 (CPU)"
"${PIP[@]}" install --upgrade pip >/dev/null
"${PIP[@]}" install torch==2.13.0
echo "==> installing enginesmith[quantization,onnx,flows,kubernetes,s3,signing,validation,dev]"
"${PIP[@]}" install -e '.[quantization,onnx,flows,kubernetes,s3,signing,validation,dev]' -c "$PINS"
echo "$want" > "$stamp"
