"""A night's GPU cells as the runs a fleet dispatcher places on nodes: each cell's run (and, first, its handover
run on another pool where its kind has one: an LLM quantised on ``quantize_on``'s SKU), with the GPUs it holds,
its estimated time and its dispatch; and the cells the fleet cannot run, with why, before anything starts.

Pure planning over the kinds (``CellKind.handover``) and the cost model (``enginesmith.core.cost``); the Prefect
side is ``flows.fleet``.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from enginesmith.core.cost import CellCost, estimate_planned
from enginesmith.core.fleet import Fleet, Job, Unschedulable, night_jobs, unschedulable
from enginesmith.core.specs import PipelineConfig
from pipeline.common.protocol import CellKind, Dispatch, PlannedCell


class FleetRun(BaseModel):
    """One run the night places on a node of ``job.pool`` (a SKU): through the Prefect work pool ``work_pool``,
    on the work queue named after the node."""

    job: Job
    work_pool: str
    dispatch: Dispatch


class FleetNight(BaseModel):
    runs: list[FleetRun]
    costs: list[CellCost]
    unschedulable: list[Unschedulable]


def plan_fleet_night(config_path: str, config: PipelineConfig, cells: list[tuple[CellKind, PlannedCell]],
                     fleet: Fleet, pool_of: Callable[[CellKind, PlannedCell], str]) -> FleetNight:
    """The runs for ``cells`` (GPU cells to build tonight) on ``fleet``; ``pool_of`` gives a cell's own work pool
    (its kind's, or a route's). A cell the cost model cannot estimate holds a whole node of its SKU (its size is
    unknown, so nothing may share the node) and is dispatched after the estimated ones."""
    costs, _ = estimate_planned([cell for _, cell in cells], config)
    estimated = {cost.cell_id for cost in costs}
    nodes = fleet.pools()
    blocked = unschedulable(costs, fleet) + [
        Unschedulable(cell_id=cell.id, stage="-", pool=cell.target.id,
                      reason=f"the fleet has no {cell.target.id} nodes")
        for _, cell in cells if cell.id not in estimated and not nodes.get(cell.target.id)]
    refused = {u.cell_id for u in blocked}
    jobs = {job.id: job for job in night_jobs([cost for cost in costs if cost.cell_id not in refused])}
    runs: list[FleetRun] = []
    for kind, cell in cells:
        if cell.id in refused:
            continue
        if cell.id not in estimated:
            whole = Job(id=cell.id, cell_id=cell.id, phase="cell", pool=cell.target.id,
                        gpus=max(nodes[cell.target.id]), seconds=0.0, gpu_seconds=0.0)
            runs.append(FleetRun(job=whole, work_pool=pool_of(kind, cell), dispatch=kind.dispatch(config_path, cell)))
            continue
        job = jobs[cell.id]
        if job.after is not None:
            handover = kind.handover(config_path, cell)
            if handover is None:  # the cost model quantises elsewhere but the kind does not hand over
                raise AssertionError(f"{cell.id}: quantised on {jobs[job.after].pool} without a handover run")
            runs.append(FleetRun(job=jobs[job.after], work_pool=handover[0], dispatch=handover[1]))
        runs.append(FleetRun(job=job, work_pool=pool_of(kind, cell), dispatch=kind.dispatch(config_path, cell)))
    return FleetNight(runs=runs, costs=costs, unschedulable=blocked)
