"""Which TensorRT-LLM and TensorRT a ``trtllm-build`` runs with: read from the interpreter of that script
(its shebang), via importlib.metadata, so nothing GPU-bound is imported to find out."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from enginesmith.errors import UserError

# ModelOpt is not among them: the artefact's "modelopt" is the exporter the quantised checkpoint records.
PACKAGES = {
    "tensorrt_llm": ["tensorrt_llm", "tensorrt-llm"],
    "tensorrt": ["tensorrt", "tensorrt-cu12", "tensorrt-cu13"],
    "torch": ["torch"],
}

_QUERY = """
import json, sys
from importlib.metadata import version, PackageNotFoundError
found = {}
for key, names in json.loads(sys.argv[1]).items():
    for name in names:
        try:
            found[key] = version(name)
            break
        except PackageNotFoundError:
            pass
print(json.dumps(found))
"""


def find_executable(name: str) -> Path:
    path = shutil.which(name)
    if path is None:
        raise UserError(f"{name} is not on PATH", where=name,
                        hint="run the build inside the TensorRT-LLM 1.2.1 image (pip install 'enginesmith[trtllm]' "
                             "on a GPU node)")
    return Path(path)


def interpreter_of(script: Path) -> str:
    """The Python a console script runs with (``#!/path/python`` or ``#!/usr/bin/env python3``)."""
    first_line = script.open("rb").readline().decode(errors="replace").strip()
    if not first_line.startswith("#!"):
        raise UserError(f"{script} is not a Python console script", where=str(script))
    parts = first_line[2:].split()
    return parts[1] if Path(parts[0]).name == "env" and len(parts) > 1 else parts[0]


def toolchain_versions(script: Path) -> dict[str, str]:
    """Installed versions of TensorRT-LLM, TensorRT and torch next to ``script`` (those found)."""
    result = subprocess.run([interpreter_of(script), "-c", _QUERY, json.dumps(PACKAGES)], capture_output=True,
                            text=True, timeout=60)
    if result.returncode != 0:
        raise UserError(f"cannot read the versions next to {script}: {result.stderr.strip()[-500:]}", where=str(script))
    return dict(json.loads(result.stdout))
