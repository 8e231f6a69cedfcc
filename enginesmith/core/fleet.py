"""A GPU fleet as a night sees it: nodes per SKU pool with their GPUs (a fleet file), which planned cells it can run
at all, the night's lower bound per pool, and what a dispatch policy makes of it (a list-scheduling simulation on
the cost model's stage times: what the fleet bench's real Prefect night is measured against).

Pure: a fleet file is read by ``load_fleet``; everything else is a function of the fleet and the cells' costs.
"""

from __future__ import annotations

import heapq
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


Policy = Literal["longest-first", "plan-order", "shortest-first"]


class Placement(BaseModel):
    cell_id: str
    stage: str
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


def simulate(costs: list[CellCost], fleet: Fleet, *, policy: Policy = "longest-first",
             first: Callable[[CellCost], bool] | None = None) -> Simulation:
    """The night as a greedy list scheduler runs it: each cell's GPU stages in order (a stage starts when the one
    before it ends, on any node of its pool with enough free GPUs); whenever GPUs free up, the waiting stage first
    in the policy's order that fits starts. ``first`` puts the cells it selects ahead of the rest (a changed model's
    cells before unchanged ones). Stages holding no GPU (the pull) take their time without a slot. Unschedulable
    cells are left out."""
    blocked = {u.cell_id for u in unschedulable(costs, fleet)}
    runnable = [cost for cost in costs if cost.cell_id not in blocked]
    order = {cost.cell_id: rank for rank, cost in enumerate(_ordered(runnable, policy, first))}
    free = {pool: list(nodes) for pool, nodes in fleet.pools().items()}
    next_stage = {cost.cell_id: 0 for cost in runnable}
    by_id = {cost.cell_id: cost for cost in runnable}
    ready: dict[str, float] = {cost.cell_id: 0.0 for cost in runnable}  # when its next stage may start
    events: list[tuple[float, int, str, int, int, str]] = []  # (end, seq, pool, node, gpus, cell)
    placements: list[Placement] = []
    now, seq = 0.0, 0
    while True:
        started = True
        while started:
            started = False
            for cell_id in sorted((c for c in ready if ready[c] <= now), key=order.__getitem__):
                stage = by_id[cell_id].stages[next_stage[cell_id]]
                node = _fitting_node(free.get(stage.pool, []), stage)
                if node is None:
                    continue
                end = now + stage.seconds
                free[stage.pool][node] -= stage.gpus
                placements.append(Placement(cell_id=cell_id, stage=stage.stage, pool=stage.pool, node=node,
                                            gpus=stage.gpus, start_s=now, end_s=end))
                del ready[cell_id]
                heapq.heappush(events, (end, seq, stage.pool, node, stage.gpus, cell_id))
                seq += 1
                started = True
        if not events:
            break
        now, _, pool, node, gpus, cell_id = heapq.heappop(events)
        free[pool][node] += gpus
        next_stage[cell_id] += 1
        if next_stage[cell_id] < len(by_id[cell_id].stages):
            ready[cell_id] = now
    if ready:
        raise AssertionError(f"stages never placed: {sorted(ready)}")  # unschedulable ones were left out
    return Simulation(policy=policy, placements=placements,
                      makespan_s=max((p.end_s for p in placements), default=0.0))


def _fitting_node(nodes: list[int], stage: StageCost) -> int | None:
    """The node with the fewest free GPUs that still fits the stage (keeps whole nodes for wide stages)."""
    fitting = [(free, index) for index, free in enumerate(nodes) if free >= stage.gpus]
    return min(fitting)[1] if fitting else None


def _ordered(costs: list[CellCost], policy: Policy, first: Callable[[CellCost], bool] | None) -> list[CellCost]:
    if policy == "longest-first":
        ranked = sorted(costs, key=lambda cost: -cost.gpu_seconds)
    elif policy == "shortest-first":
        ranked = sorted(costs, key=lambda cost: cost.gpu_seconds)
    else:
        ranked = list(costs)
    if first is not None:
        ranked = sorted(ranked, key=lambda cost: not first(cost))  # stable: the policy's order within each part
    return ranked
