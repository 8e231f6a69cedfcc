"""The encoder stages on the real all-MiniLM-L6-v2: export, the fp32 and fp16 graphs, the onnx artefact and a
tensorrt-engine artefact (trtexec is the labelled TEST DOUBLE tests/fakes/trtexec.py: no GPU or TensorRT here);
the gates that refuse a candidate; the resolver on encoder manifests."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginesmith.core.artefacts import GpuInfo
from enginesmith.core.config import default_catalogue
from enginesmith.core.errors import UserError
from enginesmith.core.specs import EncoderGateSpec, EncoderModelSpec
from tests.test_tensorrt_encoder import fake_trtexec_bin, fake_trtexec_env  # noqa: F401 (fixtures)

H100 = GpuInfo(name="NVIDIA H100 80GB HBM3", pci_device_id="0x2330", sm=90, memory_total_bytes=80 * 2**30,
               driver_version="580.65.06")  # what NVML would report on the build node (no GPU here)


@pytest.fixture(scope="module")
def fp32_graph(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from enginesmith.core.checkpoints.pull import local_checkpoint
    from quantization.encoder_stage import export_stage, quantize_stage

    work = tmp_path_factory.mktemp("encoder-build")
    checkpoint = local_checkpoint(minilm_dir)
    export = export_stage(checkpoint, 13, work / "export")
    recipe = default_catalogue().encoder_recipes["fp32"]
    model = EncoderModelSpec(id="all-minilm-l6-v2", repo=str(minilm_dir), max_length=128)
    return quantize_stage(model, recipe, checkpoint, export, "q" * 64, work / "fp32"), checkpoint, export, work


def build(graph, kind: str, target: str, out: Path, gpu: GpuInfo | None = None):  # type: ignore[no-untyped-def]
    from builders.encoder_artefact import EncoderBuildRequest, build_encoder_artefact

    return build_encoder_artefact(EncoderBuildRequest(graph=graph, model_id="all-minilm-l6-v2",
                                                      target=default_catalogue().targets[target], kind=kind,
                                                      key="b" * 64, out_dir=str(out)), build_gpu=gpu)


def test_export_is_reused_and_the_fp32_recipe_is_the_export(fp32_graph) -> None:  # type: ignore[no-untyped-def]
    from quantization.encoder_stage import export_stage

    graph, checkpoint, export, work = fp32_graph
    assert graph.graph_path.read_bytes() == Path(export.onnx_path).read_bytes()
    assert (graph.max_seq_length, graph.layout.pooling, graph.quantization) == (128, "mean", None)
    before = Path(export.onnx_path).stat().st_mtime_ns
    assert export_stage(checkpoint, 13, work / "export") == export  # complete: read back, not exported again
    assert Path(export.onnx_path).stat().st_mtime_ns == before


def test_onnx_artefact_holds_graph_tokenizer_and_serving_config(fp32_graph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from enginesmith.core.encoder_graph import EmbeddingServeConfig

    graph = fp32_graph[0]
    artefact = build(graph, "onnx", "cpu", tmp_path / "onnx")
    assert sorted(f.path for f in artefact.files) == ["embedding_config.json", "model.onnx", "tokenizer.json"]
    assert artefact.kind == "onnx" and artefact.runtimes == ["onnxruntime"] and artefact.serve
    served = EmbeddingServeConfig.read(tmp_path / "onnx")
    assert (served.max_seq_length, served.pooling, served.normalize) == (128, "in_graph", True)
    assert not (tmp_path / "onnx.partial").exists()


def test_tensorrt_engine_artefact_is_built_by_trtexec_beside_the_graph(
        fp32_graph, tmp_path: Path, fake_trtexec_env: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    graph = fp32_graph[0]
    artefact = build(graph, "tensorrt-engine", "h100-sxm", tmp_path / "engine", gpu=H100)
    assert "model.plan" in {f.path for f in artefact.files}
    assert artefact.versions["tensorrt"] == "11.4.0" and artefact.build_gpu == H100
    shapes = artefact.build_config["engine"]["shapes"]  # type: ignore[index]
    assert shapes["input_ids"]["max"] == [64, 128]  # type: ignore[index]
    assert artefact.serve == []  # no embeddings server runs a TensorRT engine here: not claimed


def test_tensorrt_engine_without_a_gpu_of_the_sku_is_refused_leaving_nothing(
        fp32_graph, tmp_path: Path, fake_trtexec_env: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    with pytest.raises(UserError, match="built on a GPU of that SKU"):
        build(fp32_graph[0], "tensorrt-engine", "h100-sxm", tmp_path / "engine", gpu=None)
    assert not (tmp_path / "engine").exists() and not (tmp_path / "engine.partial").exists()


def test_fp16_recipe_casts_the_graph(fp32_graph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import onnx

    from quantization.encoder_stage import quantize_stage

    graph, checkpoint, export, _ = fp32_graph
    recipe = default_catalogue().encoder_recipes["fp16"]
    model = EncoderModelSpec(id="all-minilm-l6-v2", repo=checkpoint.local_path)
    fp16 = quantize_stage(model, recipe, checkpoint, export, "h" * 64, tmp_path / "fp16")
    loaded = onnx.load(str(fp16.graph_path))
    weight_types = {init.data_type for init in loaded.graph.initializer if len(init.dims) == 2}
    assert weight_types == {onnx.TensorProto.FLOAT16}
    assert fp16.graph_path.stat().st_size < 0.6 * graph.graph_path.stat().st_size


def test_gates_refuse_a_candidate_far_from_the_reference() -> None:
    from enginesmith.core.reports.encoder import EncoderSide
    from enginesmith.core.reports.measures import CosineAgreement, RetrievalScore, Spread
    from validation.encoder_stage import encoder_gates

    def side(name: str, cosine: float, recall: float) -> EncoderSide:
        return EncoderSide(name=name, what=name, cosine_to_reference=CosineAgreement(
            inputs=120, min_cosine=cosine, mean_cosine=cosine), retrieval=RetrievalScore(
            k=10, queries=20, recall_at_k=recall, missed=[]))

    sides = {"candidate": side("candidate", 0.78, 0.85), "reference": side("reference", 1.0, 1.0)}
    gates = {g.name: g for g in encoder_gates("int8", sides, Spread(values=[0.3, 0.35, 0.32]), EncoderGateSpec())}
    assert not gates["min_cosine_to_reference"].passed and gates["min_cosine_to_reference"].limit == 0.95
    assert not gates["recall@10_drop"].passed
    assert not gates["throughput_ratio_vs_fp32_onnx"].passed  # a 3× slowdown, far outside the spread
    same = {"candidate": side("candidate", 0.97, 1.0), "reference": side("reference", 1.0, 1.0)}
    assert all(g.passed for g in encoder_gates("int8", same, Spread(values=[0.8, 1.0, 1.25]), EncoderGateSpec()))


def test_resolver_runs_onnx_on_the_cpu_and_checks_an_engines_tensorrt(fp32_graph, tmp_path: Path,
                                                                      fake_trtexec_env: Path) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    from registry.manifest import Manifest, validation_metric
    from registry.resolve import Constraints, GpuSlot, Machine, assess

    graph = fp32_graph[0]
    onnx_artefact = build(graph, "onnx", "cpu", tmp_path / "onnx")
    engine = build(graph, "tensorrt-engine", "h100-sxm", tmp_path / "engine", gpu=H100)
    from tests.report_factory import encoder_report

    report = encoder_report("a" * 64, "b" * 64, candidate_embeddings_per_s={1: 40.0, 8: 150.0},
                            candidate_latency_ms={1: 20.0, 8: 210.0})
    assert validation_metric(report, "throughput") == 150.0 and validation_metric(report, "latency") == 20.0
    stamp = "2026-12-01T00:00:00+00:00"
    cpu = Machine(source="cpu", description="cpu", host_memory_bytes=16 * 2**30)
    on_cpu = assess(Manifest(model="m", key="b" * 64, published=stamp, artefact=onnx_artefact, validation=report),
                    cpu, Constraints())
    assert on_cpu.status == "runnable" and on_cpu.metric == 150.0
    h100 = Machine(source="detected", description="h100", runtime_versions={"tensorrt": "10.14.1"},
                   gpus=[GpuSlot(index=0, name="H100", target_id="h100-sxm", sm=90, memory_bytes=80 * 2**30)])
    engine_on_h100 = assess(Manifest(model="m", key="b" * 64, published=stamp, artefact=engine), h100, Constraints())
    assert engine_on_h100.status == "incompatible"
    assert "built with TensorRT 11.4.0; this machine has 10.14.1" in engine_on_h100.reasons[0]


def test_a_failed_engine_build_leaves_its_log_and_no_artefact(  # type: ignore[no-untyped-def]
        fp32_graph, tmp_path: Path, fake_trtexec_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    monkeypatch.setenv("FAKE_TRTEXEC_FAIL", "no-engine")
    with pytest.raises(UserError) as caught:
        build(fp32_graph[0], "tensorrt-engine", "h100-sxm", tmp_path / "engine", gpu=H100)
    log = tmp_path / "engine.trtexec.log"
    assert str(log) in (caught.value.hint or "") + caught.value.message + (caught.value.where or "")
    assert "TensorRT.trtexec" in log.read_text()  # the log the error points at is still there
    assert not (tmp_path / "engine").exists() and not (tmp_path / "engine.partial").exists()


def test_a_stage_refuses_a_toolchain_other_than_its_keys(fp32_graph, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from enginesmith.core.encoder_graph import installed_encoder_tools
    from quantization.encoder_stage import export_stage

    _, checkpoint, _, _ = fp32_graph
    installed = installed_encoder_tools()
    assert installed["onnx"] == "1.21.0" and "+" not in installed["torch"]
    with pytest.raises(UserError, match=r"onnx 1\.99\.0 \(the key's\) but 1\.21\.0 here") as caught:
        export_stage(checkpoint, 13, tmp_path / "export", expected_versions={"onnx": "1.99.0"})
    assert caught.value.where == "toolchains" and not (tmp_path / "export").exists()


def test_the_checkpoint_digest_covers_the_sentence_transformers_modules(minilm_dir: Path) -> None:
    from enginesmith.core.checkpoints.pull import local_checkpoint

    files = {f.path for f in local_checkpoint(minilm_dir).files}
    assert {"modules.json", "1_Pooling/config.json", "sentence_bert_config.json", "tokenizer.json"} <= files
    assert "README.md" not in files and "provenance.json" not in files
