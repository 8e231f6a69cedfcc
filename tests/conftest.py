"""Shared test setup. Each helper builds real inputs; nothing here fakes a component that can run here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIGS = REPO_ROOT / "configs"


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real ``enginesmith`` entry point in a subprocess, as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "enginesmith", *args], capture_output=True, text=True, env=full_env,
        cwd=cwd or REPO_ROOT, timeout=300,
    )


@pytest.fixture
def write_config(tmp_path: Path):
    """Write a YAML config file from text; returns its path."""

    def write(text: str, name: str = "matrix.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``gpu`` tests run only where NVML sees an NVIDIA GPU; elsewhere they are skipped with the reason."""
    from enginesmith.gpus import read_gpus

    if read_gpus():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (NVML found none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
