"""Every package imports on a machine without the GPU-only or heavy packages (they are imported lazily)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO_ROOT

BLOCKED = ["torch", "modelopt", "tensorrt_llm", "tensorrt", "vllm", "transformers"]

# A meta-path finder that makes the blocked packages unimportable, as on a bare deployment node.
SCRIPT = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError("blocked for this test: " + name)
        return None
sys.meta_path.insert(0, Block())
import enginesmith, pipeline, flows, builders, quantization, validation, registry
import enginesmith.cli, enginesmith.core.plan, enginesmith.core.gpus
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {BLOCKED!r})
assert not loaded, loaded
print("ok")
"""


def test_packages_import_without_gpu_packages():
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
