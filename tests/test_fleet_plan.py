"""#50 items 1-3, the pure part: a fleet file (nodes per SKU pool), the cells it cannot run reported before the
night, each pool's lower bound, and a list-scheduling simulation of the night on the cost model's stage times
that the real Prefect night is measured against. Checked: the bad fleet files, that no schedule beats its bound
or oversubscribes a node, stages keep their order, and a changed model's cells go first."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from enginesmith.core.config import default_catalogue, load_pipeline_config
from enginesmith.core.cost import CellCost, StageCost, estimate_cell
from enginesmith.core.errors import ConfigError
from enginesmith.core.fleet import (
    Fleet,
    Job,
    NodeGroup,
    Policy,
    Simulation,
    load_fleet,
    lower_bounds,
    night_jobs,
    place,
    rank_cells,
    simulate,
    unschedulable,
)
from enginesmith.core.plan import plan_matrix
from tests.conftest import CONFIGS

PRODUCTION = CONFIGS / "fleets" / "production.yaml"


@pytest.fixture(scope="module")
def nightly_costs() -> list[CellCost]:
    catalogue = default_catalogue()
    config = load_pipeline_config(CONFIGS / "nightly.yaml", catalogue)
    plan = plan_matrix(config, catalogue, calibration_fingerprint="test")
    return [estimate_cell(cell, workload=config.workload, tuning=config.tuning) for cell in plan.buildable
            if not cell.target.is_cpu]


def test_a_fleet_file_naming_an_unknown_sku_or_too_many_gpus_is_refused_naming_the_line(tmp_path: Path):
    catalogue = default_catalogue()
    assert sum(group.count for group in load_fleet(PRODUCTION, catalogue).nodes) == 10
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("nodes:\n  - {sku: h100-sxm, count: 1, gpus: 8}\n  - {sku: h300, count: 1, gpus: 8}\n")
    with pytest.raises(ConfigError) as error:
        load_fleet(unknown, catalogue)
    assert "h300" in error.value.render() and "nodes[1].sku" in error.value.render() and ":3" in error.value.render()
    wide = tmp_path / "wide.yaml"
    wide.write_text("nodes:\n  - {sku: gh200, count: 2, gpus: 4}\n")
    with pytest.raises(ConfigError, match="at most 1 GPUs"):
        load_fleet(wide, catalogue)


def test_cells_the_fleet_cannot_run_are_named_with_the_reason_before_the_night(nightly_costs):
    small_l40s = Fleet(nodes=[NodeGroup(sku=sku, count=1, gpus=8) for sku in ("h100-sxm", "h200", "a100-80gb", "b200")]
                       + [NodeGroup(sku="l40s", count=4, gpus=4)])
    found = {u.cell_id: u for u in unschedulable(nightly_costs, small_l40s)}
    assert set(found) == {"llama-3.1-70b-instruct/fp8/l40s/tp4/trtllm-engine"}
    assert "holds 8 GPUs at once; the largest l40s node has 4" in found[next(iter(found))].reason
    no_h200 = Fleet(nodes=[NodeGroup(sku=sku, count=1, gpus=8) for sku in ("h100-sxm", "a100-80gb", "l40s", "b200")])
    missing = unschedulable(nightly_costs, no_h200)
    assert {u.cell_id.split("/")[0] for u in missing} >= {"llama-3.1-70b-instruct"}  # quantised on H200 nodes
    assert all("no h200 nodes" in u.reason for u in missing if u.cell_id.startswith("llama-3.1-70b"))


@pytest.fixture(scope="module")
def shipped_nights(nightly_costs) -> dict[str, Simulation]:
    """The shipped night on the production fleet under each policy (the search takes seconds: once per module)."""
    fleet = load_fleet(PRODUCTION, default_catalogue())
    return {policy: simulate(nightly_costs, fleet, policy=policy) for policy in get_args(Policy)}


@pytest.mark.parametrize("policy", get_args(Policy))
def test_no_schedule_beats_its_lower_bound_oversubscribes_a_node_or_starts_a_cell_before_its_quantise_run(
        nightly_costs, shipped_nights, policy):
    fleet = load_fleet(PRODUCTION, default_catalogue())
    night = shipped_nights[policy]
    assert {p.job for p in night.placements} == {job.id for job in night_jobs(nightly_costs)}
    for bound in lower_bounds(nightly_costs, fleet):
        assert night.pool_makespan(bound.pool) >= bound.lower_bound_s * (1 - 1e-9)
    nodes = fleet.pools()
    for placement in night.placements:  # at each start, what runs on that node fits it
        running = [p for p in night.placements if p.pool == placement.pool and p.node == placement.node
                   and p.start_s <= placement.start_s < p.end_s]
        assert sum(p.gpus for p in running) <= nodes[placement.pool][placement.node]
    by_job = {p.job: p for p in night.placements}
    quantised_elsewhere = [job for job in night_jobs(nightly_costs) if job.after is not None]
    assert {job.cell_id.split("/")[0] for job in quantised_elsewhere} == {"llama-3.1-70b-instruct"}
    for job in quantised_elsewhere:
        assert by_job[job.after].pool == "h200" and by_job[job.after].end_s <= by_job[job.id].start_s


def test_the_searched_order_ends_the_shipped_night_sooner_than_longest_first_and_within_its_bound(
        nightly_costs, shipped_nights):
    """Measured: plain list scheduling let the narrow L40S cells fill both nodes while the 70B cell (a whole node
    for its validation) waited for its quantise run, then starved it (1.39 x the bound); the reservation of
    ``place`` brings longest first to about 1.12 x, its tail of 2-3 hour cells left on one node while the other
    idles; the search over the L40S order, on the same simulation, to about 1.09 x. Plan order is far worse."""
    fleet = load_fleet(PRODUCTION, default_catalogue())
    bound = max(b.lower_bound_s for b in lower_bounds(nightly_costs, fleet))
    assert shipped_nights["searched"].makespan_s <= 1.10 * bound
    assert shipped_nights["longest-first"].makespan_s > 1.11 * bound
    assert shipped_nights["plan-order"].makespan_s > 1.25 * bound


def test_the_search_is_deterministic_and_keeps_a_changed_models_cells_first(nightly_costs):
    """The bench's simulated night and the dispatcher's order are the same search: it must not vary by run."""
    fleet = load_fleet(PRODUCTION, default_catalogue())
    l40s = [cost for cost in nightly_costs if cost.pool == "l40s"]
    qwen_first = {"first": lambda cell_id: cell_id.startswith("qwen2.5-7b-instruct/")}
    changed = rank_cells(l40s, fleet, **qwen_first)
    qwen = [cell_id for cell_id in changed if cell_id.startswith("qwen2.5-7b-instruct/")]
    assert changed[:len(qwen)] == qwen and len(qwen) >= 6
    assert changed != rank_cells(l40s, fleet, policy="longest-first", **qwen_first)  # the search moved something
    assert rank_cells(l40s, fleet, **qwen_first) == changed


def test_a_wide_run_reserves_a_node_the_narrow_ones_then_leave_alone():
    wide = Job(id="w", cell_id="w", phase="cell", pool="l40s", gpus=8, seconds=10, gpu_seconds=80, after="w#q")
    narrow = [Job(id=f"n{i}", cell_id=f"n{i}", phase="cell", pool="l40s", gpus=2, seconds=10, gpu_seconds=20)
              for i in range(6)]
    free = {"l40s": [8, 8]}
    started = place([(wide, False)] + [(job, True) for job in narrow], free, {"l40s": [8, 8]})
    assert {node for _, node in started} == {1} and len(started) == 4 and free == {"l40s": [8, 0]}
    assert place([(wide, True)] + [(job, True) for job in narrow[4:]], free, {"l40s": [8, 8]}) == [(wide, 0)]


def test_one_gpu_runs_on_one_gpu_run_back_to_back_and_a_changed_models_cells_go_first():
    def cell(name: str, seconds: float) -> CellCost:
        return CellCost(cell_id=name, pool="h100-sxm",
                        stages=[StageCost(stage="validate", pool="h100-sxm", gpus=1, seconds=seconds, basis="test")])

    cells = [cell("a/short", 10), cell("b/long", 30), cell("c/mid", 20)]
    fleet = Fleet(nodes=[NodeGroup(sku="h100-sxm", count=1, gpus=1)])
    longest = simulate(cells, fleet, policy="longest-first")
    assert longest.makespan_s == 60 and [p.cell_id for p in longest.placements] == ["b/long", "c/mid", "a/short"]
    changed = simulate(cells, fleet, policy="longest-first", first=lambda cell_id: cell_id.startswith("a/"))
    assert [p.cell_id for p in changed.placements] == ["a/short", "b/long", "c/mid"]
