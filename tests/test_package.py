"""The product is what `pip install enginesmith` gives: the wheel carries every data file the installed code reads
(the catalogue, the shipped assets, the catalogue site's templates) and nothing of the checkout's (tests, venvs,
matrix configs)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from tests.package_checks import build_wheel, source_tree, tracked_files

# What the code opens from its own package directories (importlib.resources / Path(__file__) siblings).
PACKAGE_DATA = ("enginesmith/catalogue", "enginesmith/assets", "registry/templates")


def test_the_wheel_carries_every_data_file_the_code_reads_and_nothing_of_the_checkout(tmp_path: Path):
    wheel = build_wheel(tmp_path)
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


def test_the_sdist_and_the_wheel_pass_twine_check(tmp_path: Path):
    """Both distributions build from the checkout's files and pass `twine check` (metadata and README render as
    PyPI would show them); the sdist carries the package data too, so a wheel built from it is complete."""
    source = source_tree(tmp_path / "source")
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(tmp_path / "dist"),
                            str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    [sdist] = (tmp_path / "dist").glob("enginesmith-*.tar.gz")
    [wheel] = (tmp_path / "dist").glob("enginesmith-*.whl")
    checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"enginesmith/catalogue/targets.yaml", "enginesmith/catalogue/runtimes/runtimes.yaml",
            "registry/templates/catalogue.css", "pyproject.toml", "README.md", "LICENSE"} <= names
    with zipfile.ZipFile(wheel) as archive:  # the license the metadata names travels in the wheel too
        assert [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")], archive.namelist()
    assert not [name for name in names if name.startswith((".venv", "build/"))]
