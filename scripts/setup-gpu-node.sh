#!/usr/bin/env bash
# The runtime environments of a GPU node, one venv each, made from their pinned requirements in enginesmith/catalogue/runtimes/
# (runtimes.yaml says which, with which CPython, where): TensorRT-LLM 1.2.1 (trtllm-build, trtllm-serve; CPython
# 3.12, wheels from NVIDIA's index https://pypi.nvidia.com) and vLLM. They cannot share one environment, nor the
# pipeline's: each pins its own torch. Idempotent: an environment whose stamp matches its requirement files is left
# as it is; otherwise it is (re)installed and every pin is checked installed.
#
#   ./scripts/setup-gpu-node.sh [--dry-run] [ENV ...]      default: every GPU environment
#
# Where:   $ENGINESMITH_ENV_<NAME> (one environment's directory), else $ENGINESMITH_ENVS/<name>
#          (default /opt/enginesmith/envs/<name>: create it writable for the worker's user first).
# Python:  $PYTHON3_12 (for CPython 3.12, and so on), else python3.12 on PATH.
# Needs:   the pipeline's environment (./scripts/setup.sh) to read the registry; libopenmpi-dev for TensorRT-LLM.
# --dry-run prints what it would do and changes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

dry_run=0
names=()
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    -h | --help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $arg (see --help)" >&2; exit 2 ;;
    *) names+=("$arg") ;;
  esac
done

REGISTRY_PYTHON="${ENGINESMITH_VENV:-.venv}/bin/python"
[ -x "$REGISTRY_PYTHON" ] || REGISTRY_PYTHON=python3

run() {  # show a command; run it unless --dry-run
  printf '   $'; printf ' %q' "$@"; printf '\n'
  if [ "$dry_run" = 0 ]; then "$@"; fi
}

if [ "${#names[@]}" -eq 0 ]; then
  plan=$(PYTHONPATH=. "$REGISTRY_PYTHON" -m enginesmith.core.runtimes setup-plan --installed-by setup-gpu-node)
else
  plan=$(PYTHONPATH=. "$REGISTRY_PYTHON" -m enginesmith.core.runtimes setup-plan "${names[@]}")
fi
[ "$dry_run" = 0 ] || echo "==> dry run: nothing is changed"

while IFS=$'\t' read -r name kind python location first requirements image system_packages; do
  [ -n "$name" ] || continue
  if [ "$kind" = image ]; then
    echo "==> $name runs in the container image $image (its tools on the worker's PATH): nothing to install here"
    continue
  fi
  if [ "$location" = PATH ]; then
    echo "==> $name: its tools come from PATH (ENGINESMITH_ENV_* says so): nothing to install"
    continue
  fi
  files=("$requirements")
  [ "$first" = - ] || files=("$first" "$requirements")
  want="python$python $(cat "${files[@]}" | sha256sum | cut -c1-16)"
  stamp="$location/.enginesmith-setup"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    echo "==> $name ($location) is up to date"
    continue
  fi
  echo "==> $name: a CPython $python venv at $location from ${files[*]#"$PWD/"}"
  if [ "$system_packages" != - ] && command -v dpkg-query >/dev/null; then
    for package in ${system_packages//,/ }; do
      if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
        echo "   note: $name needs the system package $package (apt-get install -y $package)"
      fi
    done
  fi
  if [ -x "$location/bin/python" ]; then
    have=$("$location/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$python" != 3 ] && [ "$have" != "$python" ]; then
      echo "error: $location is a CPython $have venv, $name needs $python: remove it and run again" >&2
      exit 1
    fi
  else
    variable="PYTHON${python//./_}"
    interpreter="${!variable:-python$python}"
    if [ "$dry_run" = 0 ] && ! command -v "$interpreter" >/dev/null; then
      echo "error: $name needs CPython $python: no $interpreter on PATH (install it, or set $variable)" >&2
      exit 1
    fi
    run "$interpreter" -m venv "$location"
  fi
  pip=("$location/bin/python" -m pip --disable-pip-version-check)
  run "${pip[@]}" install --upgrade pip
  for file in "${files[@]}"; do
    run "${pip[@]}" install -r "$file"
  done
  run env PYTHONPATH=. "$REGISTRY_PYTHON" -m enginesmith.core.runtimes check "$name"
  echo "   stamp $stamp: $want"
  if [ "$dry_run" = 0 ]; then echo "$want" > "$stamp"; fi
done <<< "$plan"
