#!/usr/bin/env bash
# The main job on the embedded defaults. For now: plan the tiny CPU matrix (the pipeline stages follow).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
VENV=${ENGINESMITH_VENV:-.venv}
"$VENV/bin/enginesmith" plan configs/examples/tiny-cpu.yaml
