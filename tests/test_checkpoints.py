"""The pull stage through the real huggingface_hub: offline from the cache, online from a loopback Hub double."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from enginesmith.core.checkpoints.pull import local_checkpoint
from enginesmith.core.diskspace import require_free_space
from enginesmith.core.errors import UserError
from enginesmith.core.secrets import register_secret, scrub
from tests.conftest import REPO_ROOT, TINY_REPO_ID, run_cli
from tests.fake_hub import FakeHub, FakeHubServer

SECRET = "hf_SuperSecretToken1234567890"


def _offline_env(cache: Path) -> dict[str, str]:
    return {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def _online_env(endpoint: str, cache: Path, **extra: str) -> dict[str, str]:
    return {"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "0",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_ETAG_TIMEOUT": "5", **extra}


def test_offline_pull_of_main_and_of_its_sha_agree(hf_cache):
    cache, commit = hf_cache
    by_branch = run_cli("checkpoint", f"{TINY_REPO_ID}@main", "--json", env=_offline_env(cache))
    assert by_branch.returncode == 0, by_branch.stderr
    result = json.loads(by_branch.stdout)
    assert result["commit_sha"] == commit
    files = {f["path"]: f for f in result["files"]}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
    assert len(files["model.safetensors"]["sha256"]) == 64
    assert result["architecture"] == "LlamaForCausalLM" and result["parameter_count"] > 0

    by_sha = json.loads(run_cli("checkpoint", f"{TINY_REPO_ID}@{commit}", "--json", env=_offline_env(cache)).stdout)
    assert {k: v for k, v in by_sha.items() if k != "requested_revision"} == {
        k: v for k, v in result.items() if k != "requested_revision"}


def test_offline_miss_names_repo_and_revision(hf_cache):
    cache, _ = hf_cache
    result = run_cli("checkpoint", "org/absent@v9", env=_offline_env(cache))
    assert result.returncode == 2
    assert "org/absent@v9" in result.stderr and "not in the local Hugging Face cache" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture
def hub(tiny_model_dir):
    fake = FakeHub()
    fake.add_repo(TINY_REPO_ID, tiny_model_dir)
    with FakeHubServer(fake) as server:
        yield fake, server


def test_online_pull_resolves_the_branch_to_a_commit_first(hub, tmp_path, tiny_model_dir):
    fake, server = hub
    result = run_cli("checkpoint", f"{TINY_REPO_ID}@main", "--json", env=_online_env(server.endpoint, tmp_path))
    assert result.returncode == 0, result.stderr
    first = json.loads(result.stdout)
    assert first["commit_sha"] == fake.repos[TINY_REPO_ID].branches["main"]
    weights = next(f for f in first["files"] if f["path"] == "model.safetensors")
    assert weights["sha256"] == local_checkpoint(tiny_model_dir).files[
        [f.path for f in local_checkpoint(tiny_model_dir).files].index("model.safetensors")].sha256
    assert Path(first["local_path"], "model.safetensors").is_file()
    # Downloads name the commit, never the branch: a branch that moves mid-pull cannot mix revisions.
    assert all(f"/resolve/{first['commit_sha']}/" in r for r in fake.requests if "/resolve/" in r)

    # The branch moves: the next pull gets the new commit (and so a new checkpoint key).
    moved = tmp_path / "moved"
    shutil.copytree(tiny_model_dir, moved)
    (moved / "generation_config.json").write_text('{"max_new_tokens": 8}')
    new_sha = fake.add_repo(TINY_REPO_ID, moved, commit_sha="b" * 40)
    second = json.loads(run_cli("checkpoint", f"{TINY_REPO_ID}@main", "--json",
                                env=_online_env(server.endpoint, tmp_path)).stdout)
    assert second["commit_sha"] == new_sha != first["commit_sha"]


def test_unknown_repo_and_revision_are_named(hub, tmp_path):
    _, server = hub
    env = _online_env(server.endpoint, tmp_path)
    missing_repo = run_cli("checkpoint", "org/nothing@main", env=env)
    assert missing_repo.returncode == 2 and "repository 'org/nothing' not found" in missing_repo.stderr
    missing_rev = run_cli("checkpoint", f"{TINY_REPO_ID}@v7", env=env)
    assert missing_rev.returncode == 2
    assert f"revision 'v7' not found in repository '{TINY_REPO_ID}'" in missing_rev.stderr


def test_interrupted_download_is_completed(hub, tmp_path, tiny_model_dir):
    fake, server = hub
    fake.cut_off_once.add("model.safetensors")
    env = _online_env(server.endpoint, tmp_path)
    first = run_cli("checkpoint", f"{TINY_REPO_ID}@main", "--json", env=env)
    if first.returncode != 0:  # huggingface_hub gave up: the next run must complete the snapshot
        first = run_cli("checkpoint", f"{TINY_REPO_ID}@main", "--json", env=env)
    assert first.returncode == 0, first.stderr
    pulled = Path(json.loads(first.stdout)["local_path"])
    assert (pulled / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()

    # A snapshot with a file missing (a crash between files) is completed by the next pull.
    (pulled / "tokenizer.json").unlink()
    again = run_cli("checkpoint", f"{TINY_REPO_ID}@main", "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert (pulled / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()


def test_token_never_appears_in_output_of_a_failed_pull(tmp_path, tiny_model_dir):
    fake = FakeHub()
    fake.add_repo("org/leaky", tiny_model_dir, echo_authorization=True)
    with FakeHubServer(fake) as server:
        env = _online_env(server.endpoint, tmp_path, HF_TOKEN=SECRET)
        for args in (["checkpoint", "org/leaky@main"], ["--debug", "checkpoint", "org/leaky@main"]):
            result = run_cli(*args, env=env)
            assert result.returncode != 0
            assert SECRET not in result.stdout + result.stderr
    # The double really did receive (and echo) the token: the scrubbing is what kept it out.
    assert any("org/leaky" in r for r in fake.requests)


def test_registered_secrets_are_scrubbed_from_logs(caplog):
    register_secret(SECRET)
    with caplog.at_level(logging.INFO):
        logging.getLogger("some.library").info("request failed with Bearer %s", SECRET)
    assert SECRET not in caplog.text and "***" in caplog.text
    assert scrub(f"token={SECRET}") == "token=***"


def _with_weights_renamed(tiny_model_dir: Path, out: Path, name: str) -> Path:
    """A copy of the tiny model whose model.safetensors is called ``name``."""
    shutil.copytree(tiny_model_dir, out)
    (out / "model.safetensors").rename(out / name)
    return out


def test_pickle_only_checkpoint_is_refused_unless_allowed(tmp_path, tiny_model_dir):
    pickled = _with_weights_renamed(tiny_model_dir, tmp_path / "pickled", "pytorch_model.bin")
    with pytest.raises(UserError) as caught:
        local_checkpoint(pickled)
    assert "pytorch_model.bin" in caught.value.message and "allow_pickle" in (caught.value.hint or "")
    assert any(f.path == "pytorch_model.bin" for f in local_checkpoint(pickled, allow_pickle=True).files)


def test_remote_code_is_refused_naming_the_file(tmp_path, tiny_model_dir):
    custom = tmp_path / "custom"
    shutil.copytree(tiny_model_dir, custom)
    config = json.loads((custom / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_tiny.TinyForCausalLM"}
    (custom / "config.json").write_text(json.dumps(config))
    result = run_cli("checkpoint", str(custom))
    assert result.returncode == 2 and "modeling_tiny.py" in result.stderr and "trust_remote_code" in result.stderr
    assert run_cli("checkpoint", str(custom), "--trust-remote-code").returncode == 0


def test_local_directory_is_keyed_by_content(tmp_path, tiny_model_dir):
    copy = tmp_path / "elsewhere"
    shutil.copytree(tiny_model_dir, copy)
    assert local_checkpoint(copy).key == local_checkpoint(tiny_model_dir).key
    (copy / "generation_config.json").write_text("{}")
    assert local_checkpoint(copy).key != local_checkpoint(tiny_model_dir).key


def test_free_disk_check_refuses_with_the_numbers(tmp_path):
    with pytest.raises(UserError) as caught:
        require_free_space(tmp_path / "not" / "yet", 10**15, what="downloading org/huge@main", where="org/huge@main",
                           hint="free some space")
    assert "not enough disk for downloading org/huge@main" in caught.value.message
    assert "GiB free" in caught.value.message and f"{10**15} bytes needed" in caught.value.message


def _sharded_with_consolidated(tiny_model_dir: Path, out: Path) -> Path:
    """The tiny model in the layout of Mistral-7B-Instruct-v0.3: index + shards, and consolidated.safetensors
    (the same weights in Mistral's own format) beside them."""
    from transformers import AutoModelForCausalLM

    _with_weights_renamed(tiny_model_dir, out, "consolidated.safetensors")
    AutoModelForCausalLM.from_pretrained(tiny_model_dir).save_pretrained(out, max_shard_size="500KB")
    return out


def test_the_files_are_the_set_transformers_loads_never_a_consolidated_copy(hub, tmp_path, tiny_model_dir):
    """#15 finding 5: every root *.safetensors was taken, so consolidated.safetensors came beside the shards
    (+14.5 GB for Mistral-7B) and the parameter count doubled. Now: the index and the shards it names, and
    the parameter count of those; the same set from a local directory and from the Hub."""
    sharded = _sharded_with_consolidated(tiny_model_dir, tmp_path / "sharded")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and not (sharded / "model.safetensors").exists()
    expected_params = local_checkpoint(tiny_model_dir).parameter_count

    local = local_checkpoint(sharded)
    weights = [f.path for f in local.files if f.path.endswith(".safetensors") or f.path.endswith("index.json")]
    assert weights == sorted(["model.safetensors.index.json", *shards])
    assert local.parameter_count == expected_params

    fake, server = hub
    fake.add_repo("org/sharded", sharded)
    pulled = run_cli("checkpoint", "org/sharded@main", "--json", env=_online_env(server.endpoint, tmp_path / "c"))
    assert pulled.returncode == 0, pulled.stderr
    checkpoint = json.loads(pulled.stdout)
    assert "consolidated.safetensors" not in {f["path"] for f in checkpoint["files"]}
    assert not (Path(checkpoint["local_path"]) / "consolidated.safetensors").exists()
    assert not any("consolidated" in request for request in fake.requests)  # never downloaded
    assert checkpoint["parameter_count"] == expected_params


def test_weights_transformers_cannot_load_are_refused_naming_the_file(tmp_path, tiny_model_dir):
    only_consolidated = _with_weights_renamed(tiny_model_dir, tmp_path / "mistral-native", "consolidated.safetensors")
    with pytest.raises(UserError) as caught:
        local_checkpoint(only_consolidated)
    assert "consolidated.safetensors" in caught.value.message and "Mistral" in (caught.value.hint or "")

    incomplete = _sharded_with_consolidated(tiny_model_dir, tmp_path / "incomplete")
    weight_map = json.loads((incomplete / "model.safetensors.index.json").read_text())["weight_map"]
    missing = sorted(set(weight_map.values()))[-1]
    (incomplete / missing).unlink()
    with pytest.raises(UserError) as caught:
        local_checkpoint(incomplete)
    assert missing in caught.value.message and caught.value.where.endswith("model.safetensors.index.json")


@pytest.mark.parametrize("outage", ["503", "429", "connection refused"])
def test_a_hub_outage_is_transient_and_retried_but_a_missing_repo_is_not(hub, tmp_path, outage):
    """#15 finding 4: every Hub failure was a UserError, so the flows never retried a network blip. An outage
    (5xx, 429, nothing listening) is a TransientError, which the CLI exits 1 for and the flows retry; a repo
    that does not exist stays deterministic (exit 2, never retried)."""
    from validation.server import free_port

    fake, server = hub
    endpoint = server.endpoint if outage != "connection refused" else f"http://127.0.0.1:{free_port()}"
    if outage != "connection refused":
        fake.outage_status = int(outage)
    env = _online_env(endpoint, tmp_path, HF_HUB_DOWNLOAD_TIMEOUT="5")
    result = run_cli("checkpoint", f"{TINY_REPO_ID}@main", env=env)
    assert result.returncode == 1, result.stderr
    assert "the Hub did not answer" in result.stderr and "retry" in result.stderr
    fake.outage_status = None
    if outage != "connection refused":
        missing = run_cli("checkpoint", "org/nothing@main", env=env)
        assert missing.returncode == 2 and "not found" in missing.stderr


_PLAN_THEN_PULL = """
import json, sys
from pathlib import Path
from enginesmith.core.config import default_catalogue
from enginesmith.core.plan import Cell
from pipeline.common.plan_sources import plan_config
from pipeline.kinds import llm_steps
from pipeline.kinds.llm import cell_for
from pipeline.kinds.llm import params_for

config, phase, state = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
if phase == "plan":
    _, plan = plan_config(config, default_catalogue())
    state.write_text(plan.cells[0].model_dump_json())
else:
    cell = Cell.model_validate_json(state.read_text())
    checkpoint = llm_steps.pull(config, cell)
    _, _, dispatched = cell_for(params_for(str(config), cell))
    print(json.dumps({"pulled": checkpoint.commit_sha, "planned": cell.source_revision, "planned_key": cell.key,
                      "dispatched_key": dispatched.key}))
"""


def test_a_branch_that_moves_after_planning_is_not_followed(hub, tmp_path, tiny_model_dir):
    """#15 finding 3: the pull re-resolved the config's branch, so a `main` that moved between the nightly's plan
    and the cell's pull was keyed on one commit and built from another. Now the pull takes the planned commit, and
    the dispatched parameters carry it, so build-cell computes the nightly's key."""
    import subprocess
    import sys

    fake, server = hub
    planned_sha = fake.repos[TINY_REPO_ID].branches["main"]
    config = tmp_path / "hub.yaml"
    config.write_text(f"""
version: 1
name: hub
models:
  - id: tiny
    repo: {TINY_REPO_ID}
    revision: main
matrix:
  - models: [tiny]
    recipes: [fp8]
    targets: [cpu]
    kinds: [hf-quantized]
""")
    env = {**os.environ, **_online_env(server.endpoint, tmp_path / "cache")}

    def run(phase: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", _PLAN_THEN_PULL, str(config), phase, str(tmp_path / "cell.json")],
                              capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300)

    planned = run("plan")
    assert planned.returncode == 0, planned.stderr[-3000:]
    moved = tmp_path / "moved"
    shutil.copytree(tiny_model_dir, moved)
    (moved / "generation_config.json").write_text('{"max_new_tokens": 8}')
    assert fake.add_repo(TINY_REPO_ID, moved, commit_sha="c" * 40) != planned_sha  # main moves
    pulled = run("pull")
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    seen = json.loads(pulled.stdout.strip().splitlines()[-1])
    assert seen["planned"] == seen["pulled"] == planned_sha
    assert seen["dispatched_key"] == seen["planned_key"]


def test_a_local_model_changed_after_planning_is_refused_at_pull(tmp_path, tiny_model_dir, write_config):
    from enginesmith.core.config import default_catalogue
    from pipeline.common.plan_sources import plan_config
    from pipeline.kinds import llm_steps

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = write_config(f"""
version: 1
name: local
models:
  - id: tiny
    repo: {model}
matrix:
  - models: [tiny]
    recipes: [fp8]
    targets: [cpu]
    kinds: [hf-quantized]
""")
    _, plan = plan_config(config, default_catalogue())
    (model / "generation_config.json").write_text('{"max_new_tokens": 8}')
    with pytest.raises(UserError) as caught:
        llm_steps.pull(config, plan.cells[0])
    assert "changed after it was planned" in caught.value.message and caught.value.where == str(model)
