"""Stage keys are how the registry finds what is already built: a refactor that changed one would rebuild and republish
every artefact of that cell. Every cell the shipped configs plan (LLM and encoder cells, invalid ones too) keeps the
keys recorded in tests/data/stage_keys.json, which were recorded before the pipeline's refactor (#30) by
`enginesmith plan CONFIG --json`. Re-record only for a change that is meant to re-key (a new pin, a new key input),
and say so in its commit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, REPO_ROOT, run_cli

RECORDED = json.loads((REPO_ROOT / "tests" / "data" / "stage_keys.json").read_text())
TINY = "../../enginesmith/assets/tiny-llama"


def planned_keys(config: str, tmp_path: Path, models: dict[str, Path] | None = None) -> dict[str, dict]:  # type: ignore[type-arg]
    """Each cell's final key and stage keys as `enginesmith plan --json` prints them, for a shipped config whose
    model paths point at ``models`` (fetched models live wherever their fixture put them)."""
    text = (REPO_ROOT / config).read_text().replace(TINY, str(REPO_ROOT / "enginesmith" / "assets" / "tiny-llama"))
    for model_id, where in (models or {}).items():
        shipped = f"../../.enginesmith/models/{model_id}"
        assert shipped in text, shipped
        text = text.replace(shipped, str(where))
    copy = tmp_path / Path(config).name
    copy.write_text(text)
    # An empty Hub cache: a branch the user's cache holds would be keyed by its commit there (#62).
    planned = run_cli("plan", str(copy), "--json", env={"HF_HUB_CACHE": str(tmp_path / "empty-hf-cache")})
    assert planned.returncode == 0, planned.stderr[-2000:]
    plan = json.loads(planned.stdout)
    return {cell["id"]: {"key": cell["key"], "keys": cell["keys"]}
            for cell in plan["cells"]}


def test_every_shipped_config_is_recorded():
    shipped = {f"configs/{p.relative_to(CONFIGS)}" for p in [CONFIGS / "nightly.yaml",
                                                             *(CONFIGS / "examples").glob("*.yaml")]}
    assert shipped == set(RECORDED)


@pytest.mark.parametrize("config", ["configs/nightly.yaml", "configs/examples/tiny-cpu.yaml"])
def test_the_plan_keys_every_cell_as_recorded(config, tmp_path):
    assert planned_keys(config, tmp_path) == RECORDED[config]


def test_the_encoder_config_keys_every_cell_as_recorded(minilm_dir, tmp_path):
    config = "configs/examples/minilm-cpu.yaml"
    assert planned_keys(config, tmp_path, {"all-minilm-l6-v2": minilm_dir}) == RECORDED[config]
