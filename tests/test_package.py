"""The product is what `pip install enginesmith` gives: the wheel carries every data file the installed code reads
(the catalogue, the shipped assets, the catalogue site's templates) and nothing of the checkout's (tests, venvs,
matrix configs)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from tests.package_checks import build_wheel, tracked_files

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
