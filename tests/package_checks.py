"""Building the wheel `pip install enginesmith` installs, from the checkout's files alone."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT


def tracked_files(under: str = ".") -> set[str]:
    """The checkout's files as git sees them (tracked, and untracked ones it does not ignore)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", under], cwd=REPO_ROOT,
                            capture_output=True, text=True, check=True)
    return {line for line in listed.stdout.splitlines() if line and (REPO_ROOT / line).is_file()}


def source_tree(dest: Path) -> Path:
    """A copy of the checkout's files alone, so the build sees no stale build/ or egg-info and writes none here."""
    for name in tracked_files():
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, dest / name)
    return dest


def build_wheel(dest: Path) -> Path:
    """The wheel `pip install enginesmith` would install, built from the checkout's files."""
    source = source_tree(dest / "source")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(dest), str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = dest.glob("enginesmith-*.whl")
    return wheel
