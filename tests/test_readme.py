"""Every README code block marked `<!-- runnable -->` runs as written, from the repo root."""

from __future__ import annotations

import re
import subprocess

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
