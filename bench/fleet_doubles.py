"""TEST DOUBLES, labelled as such: the LLM kind with each stage's GPU work replaced by a sleep of the cost model's
time for it (``enginesmith.core.cost``), scaled by ``ENGINESMITH_FLEET_DOUBLE_SCALE`` (seconds slept per estimated
second: 0.01 turns an hour into 36 s). The fleet bench loads it into every process of its night (the nightly, each
worker and the runs they start) through ``ENGINESMITH_PLUGINS=fleet_doubles``; it registers itself as the ``llm``
kind and as the planner of the build-cell form, so the nightly, the fleet dispatcher, Prefect's workers, the
registry's publish and history, and the catalogue are the real ones, and only the stages' work is not.

What it cannot do here is the GPU work (no GPU, no Hub): planning keys the Hub models at their configured
revisions without asking the Hub, the preflight passes every buildable cell (its checks need the Hub and vLLM),
and a cell's run writes a small artefact of the right shape (an ``artefact.json`` and one weights file) and a
report with one gate, which passes unless ``ENGINESMITH_FLEET_DOUBLE_FAIL`` (a comma-separated list of cell-id
globs) names the cell.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from enginesmith.core.artefacts import ARTEFACT_FILE, Artefact, Lineage
from enginesmith.core.checkpoints.digest import file_sha256
from enginesmith.core.checkpoints.models import CheckpointFile
from enginesmith.core.config import Catalogue
from enginesmith.core.cost import CellCost, estimate_planned
from enginesmith.core.plan import Cell
from enginesmith.core.reports import Objective, ReportView, gate_table, register_report, view_markdown
from enginesmith.core.reports.measures import GateResult, Spread
from enginesmith.core.specs import PipelineConfig, TargetSpec
from pipeline.common import steps
from pipeline.common.params import BuildCellParams
from pipeline.common.protocol import (
    CellContext,
    CellFilter,
    CellRun,
    Dispatch,
    KindPreflight,
    PlannedCell,
    StageRunner,
)
from pipeline.common.verdicts import verdict
from pipeline.kind_registry import register_form, register_kind
from pipeline.kinds.llm import LLM, QUANTIZE_STAGE, cell_for

SCALE_ENV = "ENGINESMITH_FLEET_DOUBLE_SCALE"
FAIL_ENV = "ENGINESMITH_FLEET_DOUBLE_FAIL"
WEIGHTS_BYTES = 4096


class FleetDoubleReport(BaseModel):
    kind: Literal["fleet-double"] = "fleet-double"
    cell: str
    key: str
    slept_s: dict[str, float]  # each stage's sleep, standing for its estimated GPU work
    gates: list[GateResult]
    passed: bool

    def round_metrics(self) -> dict[str, Spread]:
        return {}

    def accuracy(self) -> dict[str, float]:
        return {}

    def objective_spread(self, objective: Objective) -> Spread | None:
        return None

    def speed_checks_harness(self) -> bool:
        return False

    def view(self) -> ReportView:
        return ReportView(kind=self.kind, passed=self.passed,
                          summary=f"{self.cell}: a timed double (slept {sum(self.slept_s.values()):.1f} s)",
                          tables=[gate_table(self.gates)])

    def markdown(self) -> str:
        return view_markdown(f"Timed double of {self.cell} (no GPU work was done)", self.view())

    def plots(self, out_dir: Path) -> list[Path]:
        return []


def scale() -> float:
    return float(os.environ.get(SCALE_ENV, "0.01"))


def cost_of(cell: Cell, config: PipelineConfig) -> CellCost:
    costs, _ = estimate_planned([cell], config)
    if not costs:
        raise RuntimeError(f"fleet double: the cost model cannot estimate {cell.id}")
    return costs[0]


def sleep_stages(cost: CellCost, names: Iterable[str], pool: str) -> dict[str, float]:
    slept: dict[str, float] = {}
    for stage in cost.stages:
        if stage.stage in names and (stage.pool == pool or stage.stage == "pull"):
            slept[stage.stage] = stage.seconds * scale()
            time.sleep(slept[stage.stage])
    return slept


def write_artefact(cell: Cell, work: Path) -> Path:
    out_dir = work / steps.ARTEFACTS_DIR / cell.stage_keys.build[:16]
    partial_dir = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial_dir, ignore_errors=True)
    partial_dir.mkdir(parents=True)
    weights = partial_dir / "weights.bin"
    weights.write_bytes(cell.key.encode() * (WEIGHTS_BYTES // len(cell.key)))
    artefact = Artefact(key=cell.stage_keys.build, kind=cell.kind, target=cell.target.id, target_sm=cell.target.sm,
                        tp=cell.tp, pp=cell.pp, versions={"fleet-double": "1"},
                        lineage=Lineage(model_id=cell.model.id, repo_id=cell.model.repo,
                                        commit_sha=cell.source_revision, checkpoint_key=cell.stage_keys.checkpoint,
                                        recipe=cell.recipe.id),
                        files=[CheckpointFile(path=weights.name, size=weights.stat().st_size,
                                              sha256=file_sha256(weights))],
                        created=datetime.now(timezone.utc).isoformat())
    (partial_dir / ARTEFACT_FILE).write_text(artefact.model_dump_json(indent=2) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    partial_dir.rename(out_dir)
    return out_dir


class FleetDoubleKind:
    """The LLM kind, planning, pools and dispatch its own; preflight and run doubled (see the module)."""

    name = "llm"

    def in_config(self, config: PipelineConfig) -> bool:
        return LLM.in_config(config)

    def plan(self, config: PipelineConfig, config_dir: Path, catalogue: Catalogue, *,
             resolve_hub: bool = True) -> list[PlannedCell]:
        return LLM.plan(config, config_dir, catalogue, resolve_hub=False)

    def preflight(self, config: PipelineConfig, config_dir: Path, catalogue: Catalogue, *,
                  parse_with_vllm: bool = True, select: CellFilter | None = None
                  ) -> tuple[list[PlannedCell], KindPreflight]:
        cells = self.plan(config, config_dir, catalogue)
        verdicts = [verdict(cell.id, cell.key, [], invalid=cell.status == "invalid")
                    for cell in cells if select is None or select(cell)]
        return cells, KindPreflight(verdicts=verdicts, skipped=["every check: a timed double (bench/fleet_doubles.py)"])

    def pool(self, cell: PlannedCell) -> str:
        return LLM.pool(cell)

    def pools(self, targets: Iterable[TargetSpec]) -> set[str]:
        return LLM.pools(targets)

    def run(self, cell: PlannedCell, context: CellContext, stage: StageRunner) -> CellRun:
        assert isinstance(cell, Cell)
        cost = cost_of(cell, context.config)
        if context.until == QUANTIZE_STAGE:
            pool = cell.quantize_target.id if cell.quantize_target else cell.target.id
            slept = sleep_stages(cost, ("pull", "quantize"), pool)
            return CellRun(stopped=f"a timed double quantised it (slept {sum(slept.values()):.1f} s)")
        elsewhere = cell.quantize_target is not None and cell.quantize_target.id != cell.target.id
        names = ("pull", "build", "validate", "tune") if elsewhere else ("pull", "quantize", "build", "validate",
                                                                          "tune")
        slept = sleep_stages(cost, names, cell.target.id)
        artefact_dir = write_artefact(cell, context.work)
        failing = [pattern for pattern in os.environ.get(FAIL_ENV, "").split(",")
                   if pattern and fnmatch.fnmatch(cell.id, pattern)]
        gates = [GateResult(name="double", measured=0.0 if failing else 1.0, limit=1.0, passed=not failing,
                            detail="a timed double's gate: fails where ENGINESMITH_FLEET_DOUBLE_FAIL names the cell")]
        report = FleetDoubleReport(cell=cell.id, key=cell.key, slept_s=slept, gates=gates, passed=not failing)
        return CellRun(artefact_dir=artefact_dir, report=report.model_dump(mode="json"))

    def dispatch(self, config_path: str, cell: PlannedCell) -> Dispatch:
        return LLM.dispatch(config_path, cell)

    def handover(self, config_path: str, cell: PlannedCell) -> tuple[str, Dispatch] | None:
        return LLM.handover(config_path, cell)

    def table_row(self, cell: PlannedCell) -> tuple[str, str]:
        return LLM.table_row(cell)


DOUBLE = FleetDoubleKind()
register_report("fleet-double", FleetDoubleReport)
register_kind(DOUBLE)
register_form(BuildCellParams, DOUBLE, partial(cell_for, resolve_hub=False))
