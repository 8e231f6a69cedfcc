"""Every code block marked `<!-- runnable -->`, in the README or on a page of the docs site, runs as written from the
repo root; the site's generated reference pages are what the code generates."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests import documentation
from tests.conftest import REPO_ROOT

RUNNABLE_LINES = 4  # the README's before the docs site (#65): moving a block must not lose one


def _runnable_lines() -> list[str]:
    return documentation.block_lines("runnable")


# What each runnable command must print for a reader to see what the README says it shows (an exit code of 0 alone
# would pass a command that printed nothing): the subcommand, then a pattern its standard output must match.
PRINTS = {
    "eval-task": r"addition exact match \(BF16, greedy\) on 400 held-out examples: (9\d|100)\.\d%",
    "plan": r"\d+ to build, \d+ invalid, \d+ cells",
    # without a GPU it says so and how to go on; with one, the GPU and the catalogue SKU it matched
    "gpus": r"No NVIDIA GPU found[\s\S]*--target|NVIDIA [\s\S]*(h100|h200|a100|l40s|b200|gh200)",
    "setup-gpu-node.sh": r"dry run: nothing is changed[\s\S]*==> trtllm: [\s\S]*==> vllm: ",
}


def _subcommand(command: str) -> str:
    """``enginesmith``'s subcommand, else the program's name."""
    words = command.split()
    return words[1] if words[0].endswith("/enginesmith") else words[0].rsplit("/", 1)[-1]


def test_readme_has_runnable_blocks():
    lines = _runnable_lines()
    assert len(lines) >= RUNNABLE_LINES, lines
    assert all(_subcommand(line) in PRINTS for line in lines), "a runnable line without an expectation"


@pytest.mark.parametrize("command", _runnable_lines())
def test_readme_command_runs(command):
    result = subprocess.run(["bash", "-c", f"set -euo pipefail; {command}"], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, f"{command}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
    assert re.search(PRINTS[_subcommand(command)], result.stdout), f"{command}\n{result.stdout[-2000:]}"


def test_the_readme_memory_table_is_what_the_memory_model_computes():
    printed = subprocess.run([sys.executable, "scripts/memory_table.py"], cwd=REPO_ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
    assert printed in documentation.text()
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")[:2]): line for line in printed.splitlines()}
    assert rows[("Llama-3.1-8B", "h100-sxm (80 GiB)")].split("|")[3].strip().startswith("1 × ")  # 8B on 1 H100
    assert rows[("Llama-3.1-70B", "h100-sxm (80 GiB)")].split("|")[3].strip().startswith("4 × ")  # 70B on 4


def test_the_generated_reference_pages_are_what_the_code_generates():
    shipped = {name: value for name, value in os.environ.items() if name != "ENGINESMITH_CONFIG_DIR"}
    checked = subprocess.run([sys.executable, "scripts/docs_reference.py", "--check"], cwd=REPO_ROOT,
                             capture_output=True, text=True, env=shipped)  # the shipped catalogue, not an operator's
    assert checked.returncode == 0, checked.stderr


def test_the_readme_is_short_and_links_into_the_site():
    readme = (REPO_ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)", readme))
    assert linked and all((REPO_ROOT / page).is_file() for page in linked), linked
