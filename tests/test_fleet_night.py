"""#50 items 1-2, the planning the nightly does before it places anything on a fleet (pipeline/fleet.py): the runs of
the shipped matrix with the GPUs each holds, the 70B cells' quantise runs dispatched first on H200 nodes, cells the
fleet cannot run blocked with their reason, a cell the cost model cannot size holding a whole node; and the CLI's
refusals of a bad fleet before Prefect starts. The placement itself runs on Prefect in bench/fleet.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginesmith.core.config import default_catalogue, load_pipeline_config
from enginesmith.core.fleet import Fleet, NodeGroup, load_fleet
from tests.conftest import CONFIGS, run_cli

PRODUCTION = CONFIGS / "fleets" / "production.yaml"


def _night(config_path: Path, fleet: Fleet):  # type: ignore[no-untyped-def]
    from flows.nightly import pool_of
    from pipeline.fleet import plan_fleet_night
    from pipeline.kinds.llm import LLM

    catalogue = default_catalogue()
    config = load_pipeline_config(config_path, catalogue, check_tasks=False)
    cells = [(LLM, cell) for cell in LLM.plan(config, config_path.parent, catalogue, resolve_hub=False)
             if cell.status == "build" and not cell.target.is_cpu]
    return cells, plan_fleet_night(str(config_path), config, cells, fleet, pool_of)


def test_the_shipped_night_is_a_run_per_cell_and_the_70b_quantise_runs_go_first_on_h200():
    cells, night = _night(CONFIGS / "nightly.yaml", load_fleet(PRODUCTION, default_catalogue()))
    runs = {run.job.id: run for run in night.runs}
    assert not night.unschedulable
    assert {run.job.cell_id for run in night.runs} == {cell.id for _, cell in cells}
    handovers = [run for run in night.runs if run.job.phase == "quantize"]
    assert {run.job.cell_id.split("/")[0] for run in handovers} == {"llama-3.1-70b-instruct"} and len(handovers) == 3
    for run in handovers:
        assert run.job.pool == "h200" and run.work_pool == "gpu-h200-engine"
        assert run.dispatch.parameters["params"]["until"] == "quantize"
        cell_run = runs[run.job.cell_id]
        assert cell_run.job.after == run.job.id and cell_run.dispatch.parameters["params"].get("until") != "quantize"
    wide = runs["llama-3.1-70b-instruct/fp8/l40s/tp4/trtllm-engine"]
    assert wide.job.gpus == 8 and wide.work_pool == "gpu-l40s-engine"  # tp4 candidate + tp4 BF16 reference
    assert runs["llama-3.1-8b-instruct/fp8/h100-sxm/tp1/hf-quantized"].job.gpus == 2


def test_cells_the_fleet_cannot_run_and_a_cell_without_a_size(tmp_path: Path):
    small = Fleet(nodes=[NodeGroup(sku="h100-sxm", count=1, gpus=8), NodeGroup(sku="h200", count=1, gpus=8),
                         NodeGroup(sku="l40s", count=2, gpus=4)])
    _, night = _night(CONFIGS / "nightly.yaml", small)
    blocked = {u.cell_id: u.reason for u in night.unschedulable}
    assert "llama-3.1-70b-instruct/fp8/l40s/tp4/trtllm-engine" in blocked
    assert "llama-3.1-8b-instruct/fp8/b200/tp1/hf-quantized" in blocked
    assert "the fleet has no b200 nodes" in blocked["llama-3.1-8b-instruct/fp8/b200/tp1/hf-quantized"]
    assert not {run.job.cell_id for run in night.runs} & set(blocked)

    unsized = tmp_path / "unsized.yaml"
    unsized.write_text((CONFIGS / "nightly.yaml").read_text().replace("    params_b: 7.25\n", ""))
    _, night = _night(unsized, load_fleet(PRODUCTION, default_catalogue()))
    mistral = [run.job for run in night.runs if run.job.cell_id.startswith("mistral-7b")]
    assert mistral and all(job.gpus == 8 and job.seconds == 0 for job in mistral)  # a whole node: size unknown


def test_the_cli_refuses_a_bad_fleet_before_prefect_starts(tmp_path: Path):
    bad = tmp_path / "fleet.yaml"
    bad.write_text("nodes:\n  - {sku: h100-sxm, count: 2, gpus: 8}\n  - {sku: h300, count: 1, gpus: 8}\n")
    done = run_cli("nightly", str(CONFIGS / "examples" / "tiny-cpu.yaml"), "--fleet", str(bad))
    assert done.returncode == 2 and "h300" in done.stderr and "nodes[1].sku" in done.stderr
    done = run_cli("nightly", str(CONFIGS / "examples" / "tiny-cpu.yaml"), "--fleet", str(PRODUCTION), "--inline")
    assert done.returncode == 2 and "--fleet" in done.stderr


@pytest.mark.parametrize("missing", ["nodes"])
def test_a_fleet_file_without_nodes_is_refused(tmp_path: Path, missing: str):
    from enginesmith.core.errors import ConfigError

    empty = tmp_path / "fleet.yaml"
    empty.write_text("name: empty\n")
    with pytest.raises(ConfigError, match=missing):
        load_fleet(empty, default_catalogue())


SMALL_MATRIX = """
models:
  - {id: llama-3.1-8b-instruct, repo: meta-llama/Llama-3.1-8B-Instruct,
     revision: 0e9e39f249a16976918f6564b8830bc894c89659, params_b: 8.03}
matrix:
  - {models: [llama-3.1-8b-instruct], recipes: [bf16, fp8, int4-awq], targets: [h100-sxm], kinds: [hf-quantized],
     tp: [1]}
"""


@pytest.mark.slow
def test_a_small_fleet_runs_each_cell_on_its_node_within_the_nodes_gpus(prefect_server, tmp_path: Path):
    """The small fleet of CI (the full one is bench/fleet.py's): one H100 node of 4 GPUs, three cells of 2 GPUs each
    (candidate and reference), through the real nightly, deploy, workers, global concurrency limit and registry,
    with the stages' work replaced by the bench's labelled timed doubles. At most two cells may run at once."""
    import yaml
    from prefect.client.orchestration import get_client

    from bench.fleet import cell_runs, night, night_checks, node_env, offline_config, start_fleet, stop_fleet
    from flows.deploy import deploy_all
    from flows.fleet import slot_limit, slots_not_ours, slots_taken
    from tests.prefect_processes import Workers

    source = tmp_path / "small.yaml"
    shipped = yaml.safe_load((CONFIGS / "nightly.yaml").read_text())
    source.write_text(yaml.safe_dump({**shipped, **yaml.safe_load(SMALL_MATRIX), "quantize_on": {}}, sort_keys=False))
    config = offline_config(source, tmp_path)
    fleet_path = tmp_path / "fleet.yaml"
    fleet_path.write_text("name: ci\nnodes:\n  - {sku: h100-sxm, count: 1, gpus: 4}\n")
    fleet = load_fleet(fleet_path, default_catalogue())
    deploy_all(targets=["h100-sxm"], nightly_config=str(config), fleet=str(fleet_path))
    env = node_env(0.0003)
    workers = Workers(prefect_server.api_url, tmp_path)
    try:
        start_fleet(workers, fleet, env)
        from datetime import datetime, timezone

        since = datetime.now(timezone.utc)
        _, summaries = night(config, fleet_path, prefect_server.api_url, env, tmp_path / "nightly.log")
    finally:
        stop_fleet(workers)
    assert [s["status"] for s in summaries] == ["built"] * 3, summaries
    checks = night_checks(config, prefect_server.api_url, since)
    assert checks["published_once"] == 3 and not checks["missing"] and not checks["left_unfinished"], checks
    runs = [run for run in cell_runs(prefect_server.api_url, since) if run.start_time and run.end_time]
    assert len(runs) == 3 and {run.work_queue_name for run in runs} == {"h100-sxm-0"}
    at_once = max(sum(other.start_time <= run.start_time < other.end_time for other in runs) for run in runs)
    assert at_once <= 2  # 2 GPUs each on a 4-GPU node
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name(slot_limit("h100-sxm-0"))
    assert limit.limit == 4 and limit.active_slots == 0
    assert slots_taken(["h100-sxm-0", "no-such-node"]) == {"h100-sxm-0": 0}

    # What a Prefect server that kept its leases in memory leaves after a restart (measured with bench/fleet.py
    # --fault restart-server --lease-storage memory): slots counted taken that nobody will give back.
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    with get_client(sync_client=True) as client:
        client.update_global_concurrency_limit(slot_limit("h100-sxm-0"), GlobalConcurrencyLimitUpdate(active_slots=4))
    try:
        taken = slots_taken(["h100-sxm-0"])
        assert slots_not_ours(taken, {"h100-sxm-0": 2}) == {"h100-sxm-0": 2}
    finally:
        with get_client(sync_client=True) as client:
            client.update_global_concurrency_limit(slot_limit("h100-sxm-0"),
                                                   GlobalConcurrencyLimitUpdate(active_slots=0))



def test_slots_this_night_does_not_hold_are_named_per_node_and_its_own_never_are():
    from flows.fleet import FOREIGN_SLOTS_WHY, slots_not_ours

    assert slots_not_ours({"l40s-0": 8, "l40s-1": 2, "h200-0": 0}, {"l40s-0": 2, "l40s-1": 2}) == {"l40s-0": 6}
    assert slots_not_ours({"l40s-0": 2}, {"l40s-0": 8}) == {}  # placed, not yet taken: the night's own
    assert "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE" in FOREIGN_SLOTS_WHY.format(count=6)
