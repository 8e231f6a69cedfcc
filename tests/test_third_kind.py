"""A third kind of cell, added in tests alone (``tests/checksum_kind.py``, a TEST KIND registered through
``CellKind`` and the report registry), goes through the whole pipeline with no change to any module outside it:
plan → preflight → the nightly (``--inline``) → publish → history → catalogue → pull. Its gate decides: a cell
that fails it is recorded and nothing is published."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT, run_cli

TINY = REPO_ROOT / "enginesmith" / "assets" / "tiny-llama"
CELL = "tiny-copy/checksum/cpu"


def checksum_config(root: Path, *, min_files: int = 3) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = {"version": 1, "name": "checksum", "plugins": ["tests.checksum_kind"],
              "registry": {"url": str(root / "registry")}, "workdir": str(root / "work"),
              "kinds": {"checksum": {"sources": [{"id": "tiny-copy", "path": str(TINY)}], "targets": ["cpu"],
                                     "min_files": min_files}}}
    path = root / "checksum.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def cli_json(*args: str, env: dict[str, str] | None = None) -> object:
    done = run_cli(*args, "--json", env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(done.stdout)


def test_the_test_kind_is_planned_and_preflighted_by_the_cli(tmp_path: Path):
    config = checksum_config(tmp_path)
    plan = cli_json("plan", str(config))
    assert [(c["id"], c["cell_kind"], c["kind"], c["status"]) for c in plan["cells"]] == [  # type: ignore[index]
        (CELL, "checksum", "checksum-copy", "build")]
    report = cli_json("preflight", str(config), "--no-vllm")
    assert [(c["id"], c["status"]) for c in report["cells"]] == [(CELL, "ready")]  # type: ignore[index]
    broken = tmp_path / "broken.yaml"
    broken.write_text(config.read_text().replace("tests.checksum_kind", "tests.no_such_kind"))
    refused = run_cli("plan", str(broken))
    assert refused.returncode != 0 and "plugins[0]" in refused.stderr and "tests.no_such_kind" in refused.stderr


@pytest.mark.slow
def test_the_test_kind_goes_from_the_nightly_to_a_pull(prefect_server, tmp_path: Path):
    from prefect.settings import PREFECT_API_URL

    env = {"PREFECT_API_URL": PREFECT_API_URL.value()}
    config = checksum_config(tmp_path)
    registry = str(tmp_path / "registry")
    # What reads the registry without a config finds the kind's report model through the environment.
    readers = {"ENGINESMITH_PLUGINS": "tests.checksum_kind", "ENGINESMITH_CACHE_DIR": str(tmp_path / "cache")}
    night = run_cli("nightly", str(config), "--inline", env=env, timeout_s=600)
    assert night.returncode == 0, night.stdout[-3000:] + night.stderr[-3000:]
    assert "1 built" in night.stdout
    again = cli_json("nightly", str(config), "--inline", env=env)
    assert [(s["cell"], s["status"]) for s in again] == [(CELL, "cached")]  # type: ignore[union-attr,index]

    history = cli_json("history", "tiny-copy", "--registry", registry, env=readers)
    cells = history["cells"]  # type: ignore[index]
    assert [c["cell"] for c in cells] == [CELL]
    build = cells[0]["builds"][-1]
    assert build["outcome"]["status"] == "built" and build["published"] and build["outcome"]["passed"] is True
    assert build["outcome"]["accuracy"] == {"files_matching": 1.0}

    site = tmp_path / "site"
    cli_json("catalogue", "--out", str(site), "--registry", registry, env=readers)
    pages = "\n".join(p.read_text() for p in site.rglob("*.html"))
    assert "checksum-copy" in pages and "min_files" in pages and "config.json" in pages

    dest = tmp_path / "pulled"
    pulled = run_cli("pull", "tiny-copy", "--target", "cpu", "--dest", str(dest), "--registry", registry, env=readers)
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    for source in TINY.rglob("*"):
        if source.is_file():
            assert (dest / source.relative_to(TINY)).read_bytes() == source.read_bytes()

    # The kind's gate decides: more files than the source has fails the cell, and nothing is published.
    strict = checksum_config(tmp_path / "strict", min_files=1000)
    failed = run_cli("nightly", str(strict), "--inline", env=env, timeout_s=600)
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    strict_history = cli_json("history", "tiny-copy", "--registry", str(tmp_path / "strict" / "registry"),
                              env=readers)
    outcome = strict_history["cells"][0]["builds"][-1]  # type: ignore[index]
    assert outcome["outcome"]["status"] == "gate-failed" and not outcome["published"]
    assert "min_files" in outcome["outcome"]["reason"]
    assert not list((tmp_path / "strict" / "registry").rglob("manifests/**/*.json"))
