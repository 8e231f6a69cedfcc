"""#50 item 1: `enginesmith plan --estimate`, each buildable GPU cell's GPU-seconds per stage on its SKU, from the
plan, the workload and tuning sections and the SKU's spec-sheet figures; each pool's total. An estimate, so these
tests check what must hold of any sound one: every buildable cell is costed and nothing else, the GPUs each stage
holds follow the plan (quantize_on's pool, the reference's doublings), faster hardware and lighter work cost less,
and the totals add up."""

from __future__ import annotations

import json

import pytest

from enginesmith.core.config import default_catalogue, load_pipeline_config
from enginesmith.core.cost import estimate_cell, pool_totals
from enginesmith.core.plan import Cell, plan_matrix
from tests.conftest import CONFIGS, run_cli

NIGHTLY = CONFIGS / "nightly.yaml"


@pytest.fixture(scope="module")
def nightly() -> tuple[object, dict[str, Cell]]:
    catalogue = default_catalogue()
    config = load_pipeline_config(NIGHTLY, catalogue)
    plan = plan_matrix(config, catalogue, calibration_fingerprint="test")
    return config, {cell.id: cell for cell in plan.cells}


def test_the_cli_costs_every_buildable_cell_and_its_pools_add_up():
    result = run_cli("plan", str(NIGHTLY), "--estimate", "--json")
    assert result.returncode == 0, result.stderr[-2000:]
    estimate = json.loads(result.stdout)
    planned = json.loads(run_cli("plan", str(NIGHTLY), "--json").stdout)["cells"]
    buildable = {cell["id"] for cell in planned if cell["status"] == "build" and cell["target"] != "cpu"}
    assert {cell["cell_id"] for cell in estimate["cells"]} == buildable and len(buildable) > 80
    assert set(estimate["not_estimated"]) == {cell["id"] for cell in planned} - buildable
    for pool in estimate["pools"]:
        stages = [stage for cell in estimate["cells"] for stage in cell["stages"] if stage["pool"] == pool["pool"]]
        assert pool["gpu_seconds"] == pytest.approx(sum(s["gpus"] * s["seconds"] for s in stages))
    assert all(cell["seconds"] > 0 and cell["gpu_seconds"] > 0 for cell in estimate["cells"])


def test_stages_hold_the_gpus_and_pools_the_plan_says(nightly):
    config, cells = nightly
    big = estimate_cell(cells["llama-3.1-70b-instruct/fp8/h100-sxm/tp4/trtllm-engine"], workload=config.workload)
    stages = {stage.stage: stage for stage in big.stages}
    assert stages["quantize"].pool == "h200" and stages["validate"].pool == "h100-sxm"  # quantize_on
    assert stages["quantize"].gpus >= 2  # 141 GB of BF16 weights, calibrated, do not fit one H200
    assert stages["build"].gpus == 4 and stages["validate"].gpus == 4 + 4  # the BF16 reference needs tp 4 too
    small = estimate_cell(cells["llama-3.1-8b-instruct/fp8/h100-sxm/tp1/hf-quantized"], workload=config.workload)
    assert [stage.stage for stage in small.stages] == ["pull", "quantize", "validate"]  # no engine to build
    assert {stage.stage: stage.gpus for stage in small.stages}["validate"] == 2
    totals = {total.pool: total for total in pool_totals([big, small])}
    assert totals["h200"].cells == 1 and totals["h100-sxm"].cells == 2
    assert totals["h200"].gpu_seconds == pytest.approx(stages["quantize"].gpu_seconds)


def test_faster_hardware_and_lighter_work_cost_less(nightly):
    config, cells = nightly

    def validate_s(cell_id: str, **workload: object) -> float:
        cost = estimate_cell(cells[cell_id], workload=config.workload.model_copy(update=workload))
        return next(stage.seconds for stage in cost.stages if stage.stage == "validate")

    fp8 = "llama-3.1-8b-instruct/fp8/{}/tp1/hf-quantized"
    assert validate_s(fp8.format("h200")) < validate_s(fp8.format("h100-sxm")) < validate_s(fp8.format("l40s"))
    assert validate_s(fp8.format("h200"), repeats=1) < validate_s(fp8.format("h200"))
    assert validate_s(fp8.format("h200"), output_len=100) < validate_s(fp8.format("h200"))

    def quantize_s(recipe: str) -> float:
        cost = estimate_cell(cells[f"llama-3.1-8b-instruct/{recipe}/h100-sxm/tp1/trtllm-engine"],
                             workload=config.workload)
        return next(stage.seconds for stage in cost.stages if stage.stage == "quantize")

    assert quantize_s("bf16") < quantize_s("fp8") < quantize_s("int4-awq")  # AWQ searches its scales


def test_a_cpu_cell_or_a_sku_without_figures_is_not_estimated(nightly):
    config, cells = nightly
    cell = cells["llama-3.1-8b-instruct/fp8/h100-sxm/tp1/hf-quantized"]
    bare = cell.model_copy(update={"target": cell.target.model_copy(update={"bf16_dense_tflops": None})})
    with pytest.raises(ValueError, match="no throughput figures for h100-sxm"):
        estimate_cell(bare, workload=config.workload)


def test_a_model_without_params_b_is_not_estimated_and_says_why(nightly):
    config, cells = nightly
    cell = cells["llama-3.1-8b-instruct/fp8/h100-sxm/tp1/hf-quantized"]
    unsized = cell.model_copy(update={"model": cell.model.model_copy(update={"params_b": None})})
    with pytest.raises(ValueError, match=r"llama-3\.1-8b-instruct has no params_b"):
        estimate_cell(unsized, workload=config.workload)
