"""The product is what `pip install enginesmith` gives: the wheel carries every data file the installed code reads
(the catalogue, the shipped assets, the catalogue site's templates) and nothing of the checkout's (tests, venvs,
matrix configs)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.conftest import REPO_ROOT

# What the code opens from its own package directories (importlib.resources / Path(__file__) siblings).
PACKAGE_DATA = ("enginesmith/catalogue", "enginesmith/assets", "registry/templates")


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


def test_the_wheel_carries_every_data_file_the_code_reads_and_nothing_of_the_checkout(tmp_path: Path):
    source = source_tree(tmp_path / "source")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                            str(tmp_path), str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = tmp_path.glob("enginesmith-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for directory in PACKAGE_DATA:
        expected = tracked_files(directory)
        assert expected, directory
        assert expected <= names, sorted(expected - names)[:10]
    assert {"enginesmith/catalogue/targets.yaml", "enginesmith/catalogue/recipes.yaml",
            "enginesmith/catalogue/runtimes/runtimes.yaml"} <= names
    tops = {name.split("/")[0] for name in names}
    assert tops == {"enginesmith", "pipeline", "flows", "builders", "quantization", "validation", "registry",
                    wheel.name.split("-py3")[0] + ".dist-info"}, tops
    assert not [name for name in names if "/tests/" in name or ".venv" in name or name.startswith("configs/")]
