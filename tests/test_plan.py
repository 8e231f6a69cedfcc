"""Planning: matrix expansion, compatibility rules, and stage keys."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enginesmith.core.compat import RULES
from enginesmith.core.config import default_catalogue
from enginesmith.core.errors import ConfigError
from enginesmith.core.keys import canonical_json, stage_key
from pipeline.common.plan_sources import plan_config
from tests.conftest import CONFIGS, run_cli
from tests.test_config import MINIMAL


def test_nightly_plan_has_cells_and_named_invalid_reasons():
    result = run_cli("plan", str(CONFIGS / "nightly.yaml"), "--json")
    assert result.returncode == 0, result.stderr
    cells = {c["id"]: c for c in json.loads(result.stdout)["cells"]}
    assert len(cells) >= 20
    invalid = {cell_id: c for cell_id, c in cells.items() if c["status"] == "invalid"}
    assert len(invalid) >= 3
    expected = {
        "llama-3.1-8b-instruct/fp8/a100-80gb/tp1/trtllm-engine": "FP8 needs SM >= 8.9",
        "llama-3.1-8b-instruct/nvfp4/h100-sxm/tp1/trtllm-engine": "NVFP4 needs Blackwell",
        "llama-3.1-8b-instruct/int4-awq/b200/tp1/trtllm-engine": "not supported on SM>=100",
        "llama-3.1-70b-instruct/fp8/l40s/tp1/trtllm-engine": "GiB",
    }
    for cell_id, phrase in expected.items():
        reasons = invalid[cell_id]["reasons"]
        assert any(phrase in r["message"] for r in reasons), (cell_id, reasons)
        assert all(r["rule"] in {rule.id for rule in RULES} for r in reasons)
    assert cells["llama-3.1-8b-instruct/int4-awq/h100-sxm/tp1/trtllm-engine"]["status"] == "build"
    assert cells["llama-3.1-70b-instruct/fp8/l40s/tp4/trtllm-engine"]["status"] == "build"
    # Its BF16 reference does not fit one H100; it is served over two, so the cell is not refused for it.
    assert cells["llama-3.1-70b-instruct/fp8/h100-sxm/tp1/trtllm-engine"]["status"] == "build"


def test_the_reference_is_served_over_as_many_gpus_as_its_bf16_weights_need():
    from enginesmith.core.config import default_catalogue
    from enginesmith.core.memory import reference_tp

    targets = default_catalogue().targets
    assert reference_tp(8.03e9, 2, targets["h100-sxm"], tp=1, pp=1) == 1
    assert reference_tp(70.6e9, 2, targets["h100-sxm"], tp=1, pp=1) == 2
    assert reference_tp(70.6e9, 2, targets["l40s"], tp=1, pp=1) == 4
    assert reference_tp(70.6e9, 4, targets["l40s"], tp=2, pp=1) == 4  # an fp32 checkpoint is served in 16 bits
    # No doubling fits on one node: the cell's own tp, whose need then fails the cell.
    assert reference_tp(405e9, 2, targets["l40s"], tp=1, pp=1) == 1


def test_plan_human_table_lists_cells_and_counts():
    result = run_cli("plan", str(CONFIGS / "nightly.yaml"))
    assert result.returncode == 0
    assert "invalid" in result.stdout and "to build" in result.stdout


def _plan(write_config, text: str):
    return plan_config(write_config(text), default_catalogue(), resolve_hub=False)[1]


@pytest.fixture
def minimal(tmp_path):
    calib = tmp_path / "calib.txt"
    calib.write_text("1+1=2\n")
    return MINIMAL.replace("{calib}", str(calib))


def test_quantised_checkpoint_is_shared_across_targets_of_a_kind(write_config, minimal):
    text = minimal.replace("targets: [h100-sxm]", "targets: [h100-sxm, h200, l40s]")
    cells = {c.id: c for c in _plan(write_config, text).cells}
    same_kind = [cells[f"m/fp8/{t}/tp1/hf-quantized"] for t in ("h100-sxm", "h200", "l40s")]
    assert len({c.stage_keys.quantize for c in same_kind}) == 1
    assert len({c.stage_keys.build for c in same_kind}) == 3
    # Engine checkpoints come from the TensorRT-LLM image's ModelOpt: another quantize key.
    assert cells["m/fp8/h100-sxm/tp1/trtllm-engine"].stage_keys.quantize != same_kind[0].stage_keys.quantize


def test_keys_are_stable_across_runs(write_config, minimal):
    first = [c.stage_keys for c in _plan(write_config, minimal).cells]
    second = [c.stage_keys for c in _plan(write_config, minimal).cells]
    assert first == second


@pytest.mark.parametrize(
    ("change", "changed_stages"),
    [
        (("revision: main", "revision: v2"), {"checkpoint", "quantize", "build", "validation"}),
        (("  dataset: ", "  samples: 7\n  dataset: "), {"quantize", "build", "validation"}),
        (("version: 1\n", "version: 1\nbuild_profile: {max_batch_size: 3}\n"), {"build", "validation"}),
        (("version: 1\n", "version: 1\nworkload: {output_len: 99}\n"), {"validation"}),
        (("version: 1\n", "version: 1\ntoolchains: {quantize: {modelopt: '0.48.0'}}\n"),
         {"quantize", "build", "validation"}),
    ],
)
def test_keys_change_exactly_with_their_inputs(write_config, minimal, change, changed_stages):
    before = {c.id: c.stage_keys.model_dump() for c in _plan(write_config, minimal).cells}
    after = {c.id: c.stage_keys.model_dump() for c in _plan(write_config, minimal.replace(*change)).cells}
    cell = "m/fp8/h100-sxm/tp1/hf-quantized"
    changed = {stage for stage in before[cell] if before[cell][stage] != after[cell][stage]}
    assert changed == changed_stages


def test_duplicate_cell_is_an_error(write_config, minimal):
    second_block = "  - models: [m]\n    recipes: [fp8]\n    targets: [h100-sxm]\n"
    text = minimal.replace("    tp: [1]\n", "    tp: [1]\n" + second_block)
    with pytest.raises(ConfigError) as caught:
        _plan(write_config, text)
    assert "listed twice" in caught.value.message and "matrix[0]" in caught.value.message


def test_tp_larger_than_the_node_is_invalid(write_config, minimal):
    text = minimal.replace("targets: [h100-sxm]", "targets: [gh200]").replace("tp: [1]", "tp: [2]")
    cells = _plan(write_config, text).cells
    assert all(c.status == "invalid" and c.violations[0].rule == "parallel-fits-node" for c in cells)


def test_engine_checkpoint_exporter_must_match_trtllm_pin(write_config, minimal):
    text = minimal.replace("version: 1\n", "version: 1\ntoolchains: {trtllm: {modelopt: '0.47.0'}}\n")
    cells = {c.id: c for c in _plan(write_config, text).cells}
    engine = cells["m/fp8/h100-sxm/tp1/trtllm-engine"]
    assert engine.status == "invalid" and engine.violations[0].rule == "engine-modelopt-pin"
    assert "~=0.37.0" in engine.violations[0].message
    assert cells["m/fp8/h100-sxm/tp1/hf-quantized"].status == "build"


def test_cpu_target_takes_only_hf_quantized_and_foldable_recipes(write_config, minimal):
    text = minimal.replace("targets: [h100-sxm]", "targets: [cpu]").replace("recipes: [bf16, fp8]",
                                                                             "recipes: [fp8, nvfp4]")
    cells = {c.id: c for c in _plan(write_config, text).cells}
    assert cells["m/fp8/cpu/tp1/hf-quantized"].status == "build"
    assert cells["m/fp8/cpu/tp1/trtllm-engine"].violations[0].rule == "engine-needs-gpu"
    assert cells["m/nvfp4/cpu/tp1/hf-quantized"].violations[0].rule == "recipe-on-cpu"


def test_every_recipe_and_gpu_target_pair_is_decided_with_a_reason():
    catalogue = default_catalogue()
    for recipe in catalogue.recipes.values():
        for kind, support in recipe.support.items():
            assert support.why, (recipe.id, kind)
            assert all(sm in {80, 86, 89, 90, 100, 103, 120} for sm in support.sm)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=6), json_values, min_size=1, max_size=6), st.randoms())
def test_key_ignores_dict_order(inputs, rnd):
    items = list(inputs.items())
    rnd.shuffle(items)
    assert stage_key("s", dict(items)) == stage_key("s", inputs)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=6), json_values, min_size=1, max_size=6), st.data())
def test_key_changes_when_any_input_changes(inputs, data):
    field = data.draw(st.sampled_from(sorted(inputs)))
    new_value = data.draw(json_values.filter(lambda v: canonical_json(v) != canonical_json(inputs[field])))
    assert stage_key("s", {**inputs, field: new_value}) != stage_key("s", inputs)


def test_a_cell_can_quantise_on_a_bigger_sku_than_it_builds_for(write_config, minimal):
    """A 40 B model's fp8 checkpoint serves on one GH200 (and so does its BF16 reference), but calibrating it in
    BF16 needs more than that node's one GPU: the plan refuses the cell until quantize_on names an H200 node."""
    text = (minimal.replace("params_b: 1.0", "params_b: 40.0").replace("recipes: [bf16, fp8]", "recipes: [fp8]")
            .replace("targets: [h100-sxm]", "targets: [gh200, h100-sxm]\n    kinds: [hf-quantized]"))
    alone = {c.id: c for c in _plan(write_config, text).cells}
    refused = alone["m/fp8/gh200/tp1/hf-quantized"]
    assert refused.status == "invalid" and refused.quantize_target is None
    assert [v.rule for v in refused.violations] == ["fits-memory"] and "quantize needs" in refused.reason

    routed = {c.id: c for c in _plan(write_config, text + "quantize_on:\n  'm/*/gh200/*': h200\n").cells}
    cell = routed["m/fp8/gh200/tp1/hf-quantized"]
    assert cell.status == "build" and cell.quantize_target is not None and cell.quantize_target.id == "h200"
    # Where it quantises does not change what it quantises: the key is the one the H100 cell shares.
    assert cell.stage_keys.quantize == routed["m/fp8/h100-sxm/tp1/hf-quantized"].stage_keys.quantize
    assert routed["m/fp8/h100-sxm/tp1/hf-quantized"].quantize_target is None


def test_quantize_on_must_name_a_target(write_config, minimal):
    with pytest.raises(ConfigError, match="'h300', which is not a target") as raised:
        _plan(write_config, minimal + "quantize_on:\n  'm/*': h300\n")
    assert raised.value.field == "quantize_on.m/*"


def _tuned(minimal: str, section: str) -> str:
    return minimal + "tuning:\n" + "".join(f"  {line}\n" for line in section.strip().splitlines())


def test_a_tuning_sweep_is_planned_for_each_cells_runtime_and_keys_only_the_cells_it_tunes(write_config, minimal):
    before = {c.id: c for c in _plan(write_config, minimal).cells}
    tuned = _tuned(minimal, "recipes: [fp8]\nknobs: {max_batch_size: [8, 64], max_num_tokens: [2048]}")
    after = {c.id: c for c in _plan(write_config, tuned).cells}
    for cell_id, cell in after.items():
        if "/fp8/" in cell_id:  # trtllm-pytorch and trtllm-tensorrt both take these knobs
            assert [p.name for p in cell.tuning] == ["max_batch_size=8,max_num_tokens=2048",
                                                     "max_batch_size=64,max_num_tokens=2048"], cell_id
            assert cell.tuning[0].args == ["--max_batch_size", "8", "--max_num_tokens", "2048"]
            assert cell.key != before[cell_id].key  # its profiles are published with it
        else:
            assert cell.tuning == [] and cell.key == before[cell_id].key
        assert cell.stage_keys.build == before[cell_id].stage_keys.build  # nothing is rebuilt for a sweep


@pytest.mark.parametrize(("section", "says"), [
    ("knobs: {max_num_seqs: [4]}", "trtllm-pytorch has no serving knob 'max_num_seqs' (it has: max_batch_size, "
                                   "max_num_tokens)"),
    ("knobs: {max_batch_size: [0, 8]}", "tuning.knobs.max_batch_size: 0 is not a positive whole number"),
    ("knobs: {max_batch_size: [8, 64]}\nbudget_s: 5\nconcurrency: [1, 8]",
     "tuning.budget_s: 5 s is less than one round of the sweep (2 profiles × 2 levels × 60 s = 240 s of measuring)"),
])
def test_a_sweep_the_runtime_cannot_take_makes_the_cell_invalid_with_the_reason(write_config, minimal, section, says):
    cells = {c.id: c for c in _plan(write_config, _tuned(minimal, section)).cells}
    cell = cells["m/fp8/h100-sxm/tp1/hf-quantized"]
    assert cell.status == "invalid" and [v.rule for v in cell.violations] == ["tuning"]
    assert says in cell.violations[0].message


def test_a_sweep_value_given_twice_is_refused_when_the_config_loads(write_config, minimal):
    with pytest.raises(ConfigError) as caught:
        _plan(write_config, _tuned(minimal, "knobs: {max_batch_size: [8, 8]}"))
    shown = caught.value.render()
    assert "tuning.knobs" in shown and "duplicate value of knob 'max_batch_size'" in shown


def test_an_fp8_kv_cache_is_swept_only_where_the_sku_has_fp8_kernels():
    from enginesmith.core.specs import TuningSpec, WorkloadSpec
    from enginesmith.core.tuning import tuning_problems

    catalogue = default_catalogue()
    sweep = TuningSpec(knobs={"kv_cache_dtype": ["auto", "fp8"]})
    on_a100 = tuning_problems(sweep, "vllm", catalogue.serving_knobs, catalogue.targets["a100-80gb"], WorkloadSpec())
    assert on_a100 == ["tuning.knobs.kv_cache_dtype: 'fp8' needs SM 8.9 or newer; a100-80gb is SM 8.0"]
    assert tuning_problems(sweep, "vllm", catalogue.serving_knobs, catalogue.targets["h100-sxm"], WorkloadSpec()) == []
