"""Which work pool a cell goes to (#17 item 3): one pool per SKU × the environment its kind needs, routes before
that rule, and the nightly's retry predicate, which dispatches again after a crash and never after a failure."""

from __future__ import annotations

import pytest


def _cells(write_config, tiny_model_dir):  # type: ignore[no-untyped-def]
    from enginesmith.core.config import default_catalogue
    from pipeline.common.plan_sources import plan_config

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
    from pipeline.kinds.llm import LLM

    pools = {cell_id: pool_of(LLM, cell) for cell_id, cell in _cells(write_config, tiny_model_dir).items()}
    assert pools == {"tiny-llama/fp8/cpu/tp1/hf-quantized": "cpu",
                     "tiny-llama/fp8/h100-sxm/tp1/hf-quantized": "gpu-h100-sxm",
                     "tiny-llama/fp8/h100-sxm/tp1/trtllm-engine": "gpu-h100-sxm-engine"}


def test_routes_come_before_the_rule_and_the_first_match_wins(write_config, tiny_model_dir):
    from flows.nightly import pool_of
    from pipeline.kinds.llm import LLM

    cells = _cells(write_config, tiny_model_dir)
    routes = {"*/h100-sxm/*/trtllm-engine": "gpu-h100-sxm-8x", "tiny-llama/*": "big-disks"}
    assert pool_of(LLM, cells["tiny-llama/fp8/h100-sxm/tp1/trtllm-engine"], routes) == "gpu-h100-sxm-8x"
    assert pool_of(LLM, cells["tiny-llama/fp8/cpu/tp1/hf-quantized"], routes) == "big-disks"
    assert pool_of(LLM, cells["tiny-llama/fp8/cpu/tp1/hf-quantized"], {"other-model/*": "x"}) == "cpu"


@pytest.mark.parametrize(("raised", "dispatched_again"), [
    ("crashed", True), ("gate", False), ("api-error", False)])
def test_the_nightly_dispatches_again_after_a_crash_only(raised, dispatched_again):
    from prefect.states import Failed

    from flows.cell import GateFailed
    from flows.dispatch import CellRunCrashed, retry_crashed

    error = {"crashed": CellRunCrashed("its build-cell run crashed"), "gate": GateFailed("tpot ratio 3.0"),
             "api-error": RuntimeError("HTTP 500")}[raised]
    assert retry_crashed(None, None, Failed(data=error)) is dispatched_again


def test_route_options_parse_in_order_into_the_routes_deploy_passes_on():
    from flows.deploy import parse_routes

    routes = parse_routes(["llama-3.1-70b-instruct/*=gpu-h200-big", " */h100-sxm/*/trtllm-engine = gpu-h100-sxm-8x"])
    assert list(routes.items()) == [("llama-3.1-70b-instruct/*", "gpu-h200-big"),
                                    ("*/h100-sxm/*/trtllm-engine", "gpu-h100-sxm-8x")]
    assert parse_routes([]) == {}


@pytest.mark.parametrize("item", ["gpu-h200-big", "=gpu-h200-big", "llama-3.1-70b-instruct/*=", " = "])
def test_a_route_without_a_pattern_or_a_pool_is_refused_naming_the_option(item):
    from enginesmith.core.errors import UserError
    from flows.deploy import parse_routes

    with pytest.raises(UserError, match="not PATTERN=POOL") as refused:
        parse_routes(["tiny-llama/*=cpu", item])
    assert refused.value.where == "--route"
    assert "--route 'llama-3.1-70b-instruct/*=gpu-h200-big'" in refused.value.render()


def test_a_pattern_routed_twice_is_refused():
    from enginesmith.core.errors import UserError
    from flows.deploy import parse_routes

    with pytest.raises(UserError, match="routed twice"):
        parse_routes(["tiny-llama/*=cpu", "tiny-llama/*=big-disks"])


def test_deploy_refuses_a_bad_route_before_contacting_the_server():
    from tests.conftest import run_cli

    # Port 9 (discard) has no Prefect server: the refusal must come before any request.
    result = run_cli("deploy", "--api-url", "http://127.0.0.1:9/api", "--route", "llama-3.1-70b-instruct/*",
                     timeout_s=120)
    assert result.returncode == 2, result.stderr
    assert "--route" in result.stderr and "PATTERN=POOL" in result.stderr and "Traceback" not in result.stderr
