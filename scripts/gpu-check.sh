#!/usr/bin/env bash
# The GPU-only checks, in one run, on a machine with an NVIDIA GPU and a CUDA build of torch.
#
# Where the project's own environment is installed (./scripts/setup.sh on a GPU node) it is used as it is.
# Where it is not (a bare CUDA image without network), the pinned wheels the checks need can be put in .whl/
# beforehand; they are installed into a scratch directory, never into the image's own environment.
# Writes its logs and the pytest report under $OUT (default: .enginesmith/gpu-check).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
OUT="${OUT:-.enginesmith/gpu-check}"
mkdir -p "$OUT"
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export PYTHONUNBUFFERED=1 MAX_JOBS="${MAX_JOBS:-16}"

if compgen -G ".whl/*.whl" >/dev/null; then
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/enginesmith-site \
    .whl/*.whl || exit 1
  export PYTHONPATH="/tmp/enginesmith-site${PYTHONPATH:+:$PYTHONPATH}"
fi

step() { echo; echo "=== $* ($(date -u +%T))"; }

step "GPU as the driver sees it"
nvidia-smi --query-gpu=name,pci.device_id,memory.total,compute_cap,driver_version --format=csv | tee "$OUT/nvidia-smi.csv"

step "versions"
"$PYTHON" - <<'EOF' | tee "$OUT/versions.txt"
import importlib.metadata as md, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| device", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
for name in ("nvidia-modelopt", "transformers", "huggingface-hub", "nvidia-ml-py", "pydantic"):
    print(name, md.version(name))
EOF

step "enginesmith gpus"
"$PYTHON" -m enginesmith gpus
"$PYTHON" -m enginesmith gpus --json | tee "$OUT/gpus.json"

step "pytest -m gpu"
timeout 480 "$PYTHON" -m pytest -m gpu tests/test_gpu_paths.py tests/test_gpus.py -rA -s -p no:cacheprovider \
  --junitxml "$OUT/gpu-tests.xml" 2>&1 | tee "$OUT/gpu-tests.log"
