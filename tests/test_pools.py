"""Which work pool a cell goes to (#17 item 3): one pool per SKU × the environment its kind needs, routes before
that rule, and the nightly's retry predicate, which dispatches again after a crash and never after a failure."""

from __future__ import annotations

import pytest


def _cells(write_config, tiny_model_dir):  # type: ignore[no-untyped-def]
    from enginesmith.config import default_catalogue
    from enginesmith.plan_sources import plan_config

    config = write_config(f"""
version: 1
name: pools
models:
  - id: tiny-llama
    repo: {tiny_model_dir}
matrix:
  - models: [tiny-llama]
    recipes: [fp8]
    targets: [cpu, h100-sxm]
    kinds: [hf-quantized, trtllm-engine]
""")
    _, plan = plan_config(config, default_catalogue(), resolve_hub=False)
    return {cell.id: cell for cell in plan.cells if cell.status != "invalid"}


def test_a_pool_per_sku_and_the_environment_its_kind_needs(write_config, tiny_model_dir):
    from flows.nightly import pool_of

    pools = {cell_id: pool_of(cell) for cell_id, cell in _cells(write_config, tiny_model_dir).items()}
    assert pools == {"tiny-llama/fp8/cpu/tp1/hf-quantized": "cpu",
                     "tiny-llama/fp8/h100-sxm/tp1/hf-quantized": "gpu-h100-sxm",
                     "tiny-llama/fp8/h100-sxm/tp1/trtllm-engine": "gpu-h100-sxm-engine"}


def test_routes_come_before_the_rule_and_the_first_match_wins(write_config, tiny_model_dir):
    from flows.nightly import pool_of

    cells = _cells(write_config, tiny_model_dir)
    routes = {"*/h100-sxm/*/trtllm-engine": "gpu-h100-sxm-8x", "tiny-llama/*": "big-disks"}
    assert pool_of(cells["tiny-llama/fp8/h100-sxm/tp1/trtllm-engine"], routes) == "gpu-h100-sxm-8x"
    assert pool_of(cells["tiny-llama/fp8/cpu/tp1/hf-quantized"], routes) == "big-disks"
    assert pool_of(cells["tiny-llama/fp8/cpu/tp1/hf-quantized"], {"other-model/*": "x"}) == "cpu"


@pytest.mark.parametrize(("raised", "dispatched_again"), [
    ("crashed", True), ("gate", False), ("api-error", False)])
def test_the_nightly_dispatches_again_after_a_crash_only(raised, dispatched_again):
    from prefect.states import Failed

    from flows.cell import GateFailed
    from flows.nightly import CellRunCrashed, retry_crashed

    error = {"crashed": CellRunCrashed("its build-cell run crashed"), "gate": GateFailed("tpot ratio 3.0"),
             "api-error": RuntimeError("HTTP 500")}[raised]
    assert retry_crashed(None, None, Failed(data=error)) is dispatched_again
