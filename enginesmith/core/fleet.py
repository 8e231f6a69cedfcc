"""A GPU fleet as a night sees it: nodes per SKU pool with their GPUs (a fleet file), which planned cells it can run
at all, the night's lower bound per pool, and what a dispatch policy makes of it (a list-scheduling simulation on
the cost model's stage times: what the fleet bench's real Prefect night is measured against).

Pure: a fleet file is read by ``load_fleet``; everything else is a function of the fleet and the cells' costs.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from enginesmith.core.config import Catalogue
from enginesmith.core.cost import CellCost, StageCost
from enginesmith.core.errors import ConfigError
from enginesmith.core.specs import StrictModel
from enginesmith.core.yamlio import YamlDocument, format_loc


class NodeGroup(StrictModel):
    """``count`` nodes of one SKU, each with ``gpus`` GPUs (what a worker of the SKU's pool offers)."""

    sku: str
    count: int = Field(ge=1)
    gpus: int = Field(ge=1)


class Fleet(StrictModel):
    name: str = "fleet"
    nodes: list[NodeGroup] = Field(min_length=1)

    def pools(self) -> dict[str, list[int]]:
        """Each SKU pool's nodes, as their GPU counts."""
        pools: dict[str, list[int]] = {}
        for group in self.nodes:
            pools.setdefault(group.sku, []).extend([group.gpus] * group.count)
        return pools

    def node_names(self) -> dict[str, list[str]]:
        """Each SKU pool's nodes by name, in ``pools``' order: ``<sku>-<index>`` (a node's work queue, the name
        its workers poll, and its GPU slots' limit)."""
        return {sku: [f"{sku}-{index}" for index in range(len(nodes))] for sku, nodes in self.pools().items()}


def load_fleet(path: Path | str, catalogue: Catalogue) -> Fleet:
    """Read a fleet file; an unknown SKU, or a node with more GPUs than the SKU's nodes have, names its line."""
    document = YamlDocument.read(path)
    fleet = document.validate(Fleet)
    for index, group in enumerate(fleet.nodes):
        loc: tuple[str | int, ...] = ("nodes", index, "sku")
        target = catalogue.targets.get(group.sku)
        if target is None or target.is_cpu:
            raise ConfigError(f"unknown GPU SKU {group.sku!r}", path=document.path, line=document.line_of(loc),
                              field=format_loc(loc),
                              hint=f"known: {', '.join(t for t, spec in catalogue.targets.items() if not spec.is_cpu)}")
        if group.gpus > target.gpus_per_node:
            loc = ("nodes", index, "gpus")
            raise ConfigError(f"a {group.sku} node has at most {target.gpus_per_node} GPUs, not {group.gpus}",
                              path=document.path, line=document.line_of(loc), field=format_loc(loc),
                              hint="the catalogue's gpus_per_node for the SKU (catalogue/targets.yaml)")
    return fleet


class Unschedulable(BaseModel):
    cell_id: str
    stage: str
    pool: str
    reason: str


def unschedulable(costs: list[CellCost], fleet: Fleet) -> list[Unschedulable]:
    """The cells a fleet cannot run, before the night starts: a stage whose pool has no nodes, or needs more GPUs
    than its pool's largest node has."""
    pools = fleet.pools()
    found = []
    for cost in costs:
        for stage in cost.stages:
            nodes = pools.get(stage.pool)
            if not nodes:
                found.append(Unschedulable(cell_id=cost.cell_id, stage=stage.stage, pool=stage.pool,
                                           reason=f"the fleet has no {stage.pool} nodes for its {stage.stage} stage"))
                break
            if stage.gpus > max(nodes):
                found.append(Unschedulable(
                    cell_id=cost.cell_id, stage=stage.stage, pool=stage.pool,
                    reason=f"its {stage.stage} stage holds {stage.gpus} GPUs at once; the largest {stage.pool} node "
                           f"has {max(nodes)}"))
                break
    return found


class PoolBound(BaseModel):
    pool: str
    gpus: int
    gpu_seconds: float
    longest_s: float  # the longest chain of one cell's stages on this pool

    @property
    def lower_bound_s(self) -> float:
        """No schedule finishes this pool's work sooner: all its GPUs busy throughout, or its longest cell."""
        return max(self.gpu_seconds / self.gpus, self.longest_s) if self.gpus else float("inf")


def lower_bounds(costs: list[CellCost], fleet: Fleet) -> list[PoolBound]:
    pools = fleet.pools()
    bounds: dict[str, PoolBound] = {}
    for cost in costs:
        for pool in {stage.pool for stage in cost.stages}:
            bound = bounds.setdefault(pool, PoolBound(pool=pool, gpus=sum(pools.get(pool, [])), gpu_seconds=0.0,
                                                      longest_s=0.0))
            here = [stage for stage in cost.stages if stage.pool == pool]
            bound.gpu_seconds += sum(stage.gpu_seconds for stage in here)
            bound.longest_s = max(bound.longest_s, sum(stage.seconds for stage in here))
    return [bounds[pool] for pool in sorted(bounds)]


class Job(BaseModel):
    """One run the night dispatches to one node: a cell's stages on its own SKU, or (``quantize_on`` another SKU)
    its pull and quantise there first, which the cell's run waits for (``after``). It holds ``gpus`` GPUs of its
    node from start to end (the most any of its stages holds) for ``seconds``; ``gpu_seconds`` is the work its
    stages do (what a pool's lower bound counts)."""

    id: str
    cell_id: str
    phase: Literal["quantize", "cell"]
    pool: str
    gpus: int
    seconds: float
    gpu_seconds: float
    after: str | None = None


QUANTIZE_SUFFIX = "#quantize"


def night_jobs(costs: list[CellCost]) -> list[Job]:
    """The runs the night dispatches for these cells: one per cell, and one more before it where its quantise
    stage runs on another SKU (that node pulls and quantises; the cell's node pulls too, to serve the reference)."""
    jobs = []
    for cost in costs:
        elsewhere = [stage for stage in cost.stages if stage.pool != cost.pool]
        here = [stage for stage in cost.stages if stage.pool == cost.pool]
        after = None
        if elsewhere:
            after = cost.cell_id + QUANTIZE_SUFFIX
            jobs.append(_job(after, cost.cell_id, "quantize", elsewhere[0].pool, elsewhere, None))
            here = [stage for stage in elsewhere if stage.stage == "pull"] + here
        jobs.append(_job(cost.cell_id, cost.cell_id, "cell", cost.pool, here, after))
    return jobs


def _job(job_id: str, cell_id: str, phase: Literal["quantize", "cell"], pool: str, stages: list[StageCost],
         after: str | None) -> Job:
    return Job(id=job_id, cell_id=cell_id, phase=phase, pool=pool, gpus=max(stage.gpus for stage in stages),
               seconds=sum(stage.seconds for stage in stages),
               gpu_seconds=sum(stage.gpu_seconds for stage in stages), after=after)


Policy = Literal["searched", "longest-first", "plan-order", "shortest-first"]
SEARCH_STEPS = 600
SEARCH_SEED = 0


def rank_cells(costs: list[CellCost], fleet: Fleet, policy: Policy = "searched",
               first: Callable[[str], bool] | None = None) -> list[str]:
    """The order the night starts cells in (cell ids), the cells ``first`` selects (a changed model's) ahead of the
    rest. ``searched`` starts from longest first and keeps each swap of two cells of the slowest pool that the
    simulation says ends the night no later (seeded, ``SEARCH_STEPS`` swaps: deterministic); longest first alone
    leaves a tail of narrow cells on one node while the others idle."""
    ranked = _ordered(costs, "longest-first" if policy == "searched" else policy)
    if first is not None:
        ranked = sorted(ranked, key=lambda cost: not first(cost.cell_id))  # stable: the policy's order within each
    order = [cost.cell_id for cost in ranked]
    if policy != "searched":
        return order
    blocked = {u.cell_id for u in unschedulable(costs, fleet)}
    runnable = [cost for cost in costs if cost.cell_id not in blocked]
    jobs = night_jobs(runnable)
    pool_of = {cost.cell_id: cost.pool for cost in runnable}
    group = {cell_id: first is not None and first(cell_id) for cell_id in order}
    rng = random.Random(SEARCH_SEED)
    best = _play(jobs, order, fleet)
    for _ in range(SEARCH_STEPS):
        slowest = max(sorted(set(pool_of.values())), key=best.pool_makespan)
        swappable = [index for index, cell_id in enumerate(order) if pool_of.get(cell_id) == slowest]
        if len(swappable) < 2:
            break
        i, j = rng.sample(swappable, 2)
        if group[order[i]] != group[order[j]]:
            continue
        trial_order = list(order)
        trial_order[i], trial_order[j] = order[j], order[i]
        trial = _play(jobs, trial_order, fleet)
        if trial.makespan_s <= best.makespan_s:
            order, best = trial_order, trial
    return order


def dispatch_order(jobs: list[Job], ranked_cells: list[str]) -> list[Job]:
    """``jobs`` in the order their cells are ranked (``rank_cells``); a cell's quantise run before its own."""
    rank = {cell_id: index for index, cell_id in enumerate(ranked_cells)}
    return sorted(jobs, key=lambda job: (rank.get(job.cell_id, len(rank)), job.phase != "quantize"))


def place(queue: list[tuple[Job, bool]], free: dict[str, list[int]],
          capacity: dict[str, list[int]]) -> list[tuple[Job, int]]:
    """Which waiting runs start now, and on which node: ``queue`` in dispatch order, each with whether it may start
    (False: the run it waits for has not ended); ``free`` each pool's nodes' free GPUs, updated in place.

    A run that may start takes the node with the fewest free GPUs that fits it (whole nodes stay whole for wide
    runs). The first run of a pool that cannot start (it does not fit, or it waits on its quantise run) reserves
    the node with the most free GPUs that could hold it: no later run starts there, so a wide run is not starved
    by narrow ones filling every node as they free up (a list scheduler's classic loss)."""
    reserved: dict[str, int] = {}
    started: list[tuple[Job, int]] = []
    for job, may_start in queue:
        nodes = free.get(job.pool, [])
        if may_start:
            fitting = [(gpus, index) for index, gpus in enumerate(nodes)
                       if gpus >= job.gpus and index != reserved.get(job.pool)]
            if fitting:
                node = min(fitting)[1]
                nodes[node] -= job.gpus
                started.append((job, node))
                continue
        if job.pool not in reserved:
            holding = [(-gpus, index) for index, gpus in enumerate(nodes) if capacity[job.pool][index] >= job.gpus]
            if holding:
                reserved[job.pool] = min(holding)[1]
    return started


class Placement(BaseModel):
    job: str
    cell_id: str
    pool: str
    node: int
    gpus: int
    start_s: float
    end_s: float


class Simulation(BaseModel):
    policy: Policy
    placements: list[Placement]
    makespan_s: float

    def pool_makespan(self, pool: str) -> float:
        return max((p.end_s for p in self.placements if p.pool == pool), default=0.0)


def simulate(costs: list[CellCost], fleet: Fleet, *, policy: Policy = "searched",
             first: Callable[[str], bool] | None = None) -> Simulation:
    """The night as the nightly's dispatcher runs it (``place`` whenever a run ends), on the cost model's times:
    what the fleet bench's real night is measured against. Unschedulable cells are left out."""
    blocked = {u.cell_id for u in unschedulable(costs, fleet)}
    runnable = [cost for cost in costs if cost.cell_id not in blocked]
    simulation = _play(night_jobs(runnable), rank_cells(runnable, fleet, policy, first), fleet)
    return simulation.model_copy(update={"policy": policy})


def _play(jobs: list[Job], ranked_cells: list[str], fleet: Fleet) -> Simulation:
    waiting = dispatch_order(jobs, ranked_cells)
    capacity = fleet.pools()
    free = {pool: list(nodes) for pool, nodes in capacity.items()}
    done: set[str] = set()
    events: list[tuple[float, int, Job, int]] = []  # (end, seq, job, node)
    placements: list[Placement] = []
    now, seq = 0.0, 0
    while waiting or events:
        queue = [(job, job.after is None or job.after in done) for job in waiting]
        for job, node in place(queue, free, capacity):
            waiting.remove(job)
            placements.append(Placement(job=job.id, cell_id=job.cell_id, pool=job.pool, node=node, gpus=job.gpus,
                                        start_s=now, end_s=now + job.seconds))
            heapq.heappush(events, (now + job.seconds, seq, job, node))
            seq += 1
        if not events:
            raise AssertionError(f"runs never placed: {[job.id for job in waiting]}")  # unschedulable: left out
        now, _, ended, node = heapq.heappop(events)
        free[ended.pool][node] += ended.gpus
        done.add(ended.id)
    return Simulation(policy="plan-order", placements=placements,
                      makespan_s=max((p.end_s for p in placements), default=0.0))


def _ordered(costs: list[CellCost], policy: Policy) -> list[CellCost]:
    if policy == "longest-first":
        return sorted(costs, key=lambda cost: -cost.gpu_seconds)
    if policy == "shortest-first":
        return sorted(costs, key=lambda cost: cost.gpu_seconds)
    return list(costs)
