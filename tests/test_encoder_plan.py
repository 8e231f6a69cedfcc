"""Encoder cells in the config and the plan: recipes, kinds and SM rules at plan time, stage keys, bad configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginesmith.core.config import default_catalogue, load_pipeline_config
from enginesmith.core.errors import ConfigError
from enginesmith.core.specs import PipelineConfig
from pipeline.kinds.encoder_plan import plan_encoders

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
MINILM_CPU = CONFIGS / "examples" / "minilm-cpu.yaml"

ENCODER_BLOCK = """
version: 1
name: enc
encoders:
  - id: enc
    repo: ./enc
encoder_matrix:
  - models: [enc]
    recipes: [{recipes}]
    targets: [{targets}]
    kinds: [{kinds}]
"""


def plan_text(write_config, recipes: str, targets: str, kinds: str, fingerprint: str = "sha256:aa"):  # type: ignore[no-untyped-def]
    config = load_pipeline_config(write_config(ENCODER_BLOCK.format(recipes=recipes, targets=targets, kinds=kinds)))
    return {c.id: c for c in plan_encoders(config, default_catalogue(), calibration_fingerprint=fingerprint,
                                           source_revisions={"enc": "sha256:" + "0" * 64})}


def test_shipped_minilm_config_plans_fp32_and_int8_on_cpu() -> None:
    config = load_pipeline_config(MINILM_CPU)
    cells = plan_encoders(config, default_catalogue(), calibration_fingerprint="sha256:aa")
    assert [(c.id, c.status) for c in cells] == [("all-minilm-l6-v2/fp32/cpu/onnx", "build"),
                                                 ("all-minilm-l6-v2/int8/cpu/onnx", "build")]


def rules(cell) -> list[str]:  # type: ignore[no-untyped-def]
    return [v.rule for v in cell.violations]


def test_fp8_encoder_on_an_sm_below_8_9_is_refused_at_plan_time(write_config) -> None:  # type: ignore[no-untyped-def]
    cells = plan_text(write_config, "fp8, int8", "a100-80gb, l40s, h100-sxm", "tensorrt-engine")
    refused = cells["enc/fp8/a100-80gb/tensorrt-engine"]
    assert refused.status == "invalid"
    assert "recipe-sm" in rules(refused)
    assert "FP8 needs SM >= 8.9" in refused.reason and "SM 8.0" in refused.reason
    # Every engine cell is refused for now (nothing here validates a TensorRT engine), but only that one for its SM
    assert rules(cells["enc/fp8/l40s/tensorrt-engine"]) == ["engine-not-validated"]
    assert rules(cells["enc/fp8/h100-sxm/tensorrt-engine"]) == ["engine-not-validated"]
    assert rules(cells["enc/int8/a100-80gb/tensorrt-engine"]) == ["engine-not-validated"]


def test_kind_and_target_must_agree(write_config) -> None:  # type: ignore[no-untyped-def]
    cells = plan_text(write_config, "fp32, fp16, fp8", "cpu, h100-sxm", "onnx, tensorrt-engine")
    assert rules(cells["enc/fp32/h100-sxm/onnx"]) == ["onnx-on-cpu"]
    assert rules(cells["enc/fp32/cpu/tensorrt-engine"]) == ["engine-needs-gpu", "engine-not-validated"]
    # fp16 and fp8 graphs are not artefacts for onnxruntime's CPU provider; each says why
    assert "FP16 kernels" in cells["enc/fp16/cpu/onnx"].reason
    assert "graph optimiser off" in cells["enc/fp8/cpu/onnx"].reason
    assert cells["enc/fp32/cpu/onnx"].status == "build"
    assert rules(cells["enc/fp16/h100-sxm/tensorrt-engine"]) == ["engine-not-validated"]


def test_stage_keys_share_what_they_can_and_move_with_what_decides_them(write_config) -> None:  # type: ignore[no-untyped-def]
    first = plan_text(write_config, "fp32, int8, fp8", "cpu, h100-sxm", "onnx, tensorrt-engine")
    recalibrated = plan_text(write_config, "fp32, int8, fp8", "cpu, h100-sxm", "onnx, tensorrt-engine",
                             fingerprint="sha256:bb")
    fp32, int8 = first["enc/fp32/cpu/onnx"], first["enc/int8/cpu/onnx"]
    fp8 = first["enc/fp8/h100-sxm/tensorrt-engine"]
    assert fp32.stage_keys.export == int8.stage_keys.export  # both opset 13: one export serves both
    assert fp8.stage_keys.export != int8.stage_keys.export  # fp8 needs opset 21
    # the same quantised graph for the cpu artefact and the H100 engine; the builds differ
    int8_engine = first["enc/int8/h100-sxm/tensorrt-engine"]
    assert int8_engine.stage_keys.quantize == int8.stage_keys.quantize
    assert int8_engine.stage_keys.build != int8.stage_keys.build
    # new calibration sentences re-key the quantised recipes, not the unquantised one
    assert recalibrated["enc/int8/cpu/onnx"].stage_keys.quantize != int8.stage_keys.quantize
    assert recalibrated["enc/fp32/cpu/onnx"].key == fp32.key
    assert len({c.key for c in first.values()}) == len(first)


def test_config_assertions_do_not_rekey_but_the_served_length_does(write_config) -> None:  # type: ignore[no-untyped-def]
    text = ENCODER_BLOCK.format(recipes="int8", targets="cpu", kinds="onnx")
    catalogue = default_catalogue()

    def key_of(config_text: str):  # type: ignore[no-untyped-def]
        config = load_pipeline_config(write_config(config_text))
        return plan_encoders(config, catalogue, calibration_fingerprint="sha256:aa",
                             source_revisions={"enc": "sha256:" + "0" * 64})[0].stage_keys

    plain = key_of(text)
    asserted = key_of(text.replace("    repo: ./enc\n", "    repo: ./enc\n    pooling: mean\n    normalize: true\n"))
    shorter = key_of(text.replace("    repo: ./enc\n", "    repo: ./enc\n    max_length: 64\n"))
    assert asserted == plain  # the config only asserts what the checkpoint's modules say
    assert shorter.export == plain.export and shorter.quantize != plain.quantize


def test_unknown_recipe_in_the_encoder_gates_is_named(write_config) -> None:  # type: ignore[no-untyped-def]
    text = (ENCODER_BLOCK.format(recipes="int8", targets="cpu", kinds="onnx")
            + "encoder_gates:\n  min_cosine: {in8: 0.99}\n")
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(write_config(text))
    assert caught.value.field == "encoder_gates.min_cosine.in8" and "int8" in (caught.value.hint or "")


def test_unknown_encoder_recipe_names_the_field_and_the_known_ones(write_config) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as caught:
        load_pipeline_config(write_config(ENCODER_BLOCK.format(recipes="int4", targets="cpu", kinds="onnx")))
    assert caught.value.field == "encoder_matrix[0].recipes[0]"
    assert "unknown encoder recipe 'int4'" in caught.value.message
    assert "fp32, fp16, int8, fp8" in (caught.value.hint or "")


def test_a_config_must_build_something() -> None:
    with pytest.raises(ValueError, match="nothing to build"):
        PipelineConfig.model_validate({"name": "empty"})
    with pytest.raises(ValueError, match="'encoders' is empty"):
        PipelineConfig.model_validate({"name": "x", "encoder_matrix": [
            {"models": ["a"], "recipes": ["fp32"], "targets": ["cpu"]}]})


def test_config_pooling_that_the_checkpoint_contradicts_is_refused(minilm_dir: Path) -> None:
    from enginesmith.core.specs import EncoderModelSpec
    from quantization.encoder_stage import served_layout

    layout, length = served_layout(EncoderModelSpec(id="m", repo=str(minilm_dir), max_length=128), minilm_dir)
    assert (layout.pooling, layout.normalize, length) == ("mean", True, 128)
    with pytest.raises(ConfigError) as caught:
        served_layout(EncoderModelSpec(id="m", repo=str(minilm_dir), pooling="cls"), minilm_dir)
    assert caught.value.field == "encoders.m.pooling" and "'mean'" in caught.value.message
    with pytest.raises(ConfigError) as too_long:
        served_layout(EncoderModelSpec(id="m", repo=str(minilm_dir), max_length=4096), minilm_dir)
    assert too_long.value.field == "encoders.m.max_length"


def test_a_pooling_the_checkpoint_contradicts_is_refused_by_the_plan(write_config, minilm_dir: Path) -> None:  # type: ignore[no-untyped-def]
    """#30: `pooling: cls` on a mean-pooled checkpoint was planned `build` and refused only when the build ran; the
    plan reads the checkpoint's modules, so the cell is invalid with the rule and the preflight never dispatches it."""
    from tests.conftest import run_cli

    config = write_config(f"""
version: 1
name: contradicted
encoders:
  - id: minilm
    repo: {minilm_dir}
    pooling: cls
encoder_matrix:
  - models: [minilm]
    recipes: [fp32]
    targets: [cpu]
    kinds: [onnx]
""")
    from pipeline.kinds.encoder import ENCODER

    [cell] = ENCODER.plan(load_pipeline_config(config), config.parent, default_catalogue())
    assert cell.status == "invalid" and rules(cell) == ["encoder-layout"]
    assert "pooling is 'cls'" in cell.reason and "'mean'" in cell.reason
    checked = run_cli("preflight", str(config), "--no-vllm")
    assert checked.returncode == 0 and "invalid" in checked.stdout and "encoder-layout" in checked.stdout
