"""Every README code block marked `<!-- runnable -->` runs as written, from the repo root."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

BLOCK = re.compile(r"<!-- runnable -->\s*```bash\n(.*?)```", re.DOTALL)


def _runnable_lines() -> list[str]:
    text = (REPO_ROOT / "README.md").read_text()
    return [line.strip() for block in BLOCK.findall(text) for line in block.splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_readme_has_runnable_blocks():
    assert _runnable_lines()


@pytest.mark.parametrize("command", _runnable_lines())
def test_readme_command_runs(command):
    result = subprocess.run(["bash", "-c", f"set -euo pipefail; {command}"], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"


def test_the_readme_memory_table_is_what_the_memory_model_computes():
    printed = subprocess.run([sys.executable, "scripts/memory_table.py"], cwd=REPO_ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
    assert printed in (REPO_ROOT / "README.md").read_text()
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")[:2]): line for line in printed.splitlines()}
    assert rows[("Llama-3.1-8B", "h100-sxm (80 GiB)")].split("|")[3].strip().startswith("1 × ")  # 8B on 1 H100
    assert rows[("Llama-3.1-70B", "h100-sxm (80 GiB)")].split("|")[3].strip().startswith("4 × ")  # 70B on 4
