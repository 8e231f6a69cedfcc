"""A TEST KIND, registered only by configs that name this module under ``plugins``: a third family of cells, added
through the ``CellKind`` protocol and the report registry alone, to show the pipeline carries a kind it was never
told about (plan → preflight → nightly → publish → history → catalogue → pull).

A checksum cell copies a local directory into an artefact, hashing every file (its "build"), then reads the copy
back and checks each file against the source (its validation), with one gate: at least ``min_files`` files, all of
them matching. Nothing here is a stand-in for a real stage of another kind; it is the smallest honest kind.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from enginesmith.core.artefacts import ARTEFACT_FILE, Artefact, Lineage
from enginesmith.core.checkpoints.digest import directory_digest, file_sha256
from enginesmith.core.checkpoints.models import CheckpointFile
from enginesmith.core.config import Catalogue
from enginesmith.core.errors import ConfigError
from enginesmith.core.keys import stage_key
from enginesmith.core.reports import Objective, ReportView, TableView, gate_table, register_report, view_markdown
from enginesmith.core.reports.measures import GateResult, Spread
from enginesmith.core.specs import PipelineConfig, TargetSpec
from pipeline.common import steps
from pipeline.common.params import RUN_CELL_FLOW, RunCellParams
from pipeline.common.protocol import (
    CellContext,
    CellFilter,
    CellRun,
    Dispatch,
    KindPreflight,
    PlannedCell,
    StageRunner,
    kind_section,
)
from pipeline.common.verdicts import Check, verdict
from pipeline.kind_registry import register_kind

NAME = "checksum"
ARTEFACT_KIND = "checksum-copy"


class ChecksumSource(BaseModel):
    id: str
    path: str  # a local directory, relative to the config file


class ChecksumSection(BaseModel):
    """``kinds.checksum`` in a config."""

    sources: list[ChecksumSource] = Field(min_length=1)
    targets: list[str] = ["cpu"]
    min_files: int = Field(1, ge=1)


class ChecksumModel(BaseModel):
    id: str
    repo: str
    is_local: bool = True


class ChecksumRecipe(BaseModel):
    id: str = "checksum"


class ChecksumKeys(BaseModel):
    build: str
    validation: str


class ChecksumCell(BaseModel):
    id: str
    kind: str = ARTEFACT_KIND
    model: ChecksumModel
    recipe: ChecksumRecipe = ChecksumRecipe()
    target: TargetSpec
    source_revision: str
    status: Literal["build", "invalid"] = "build"
    reason: str = ""
    min_files: int
    stage_keys: ChecksumKeys

    @property
    def key(self) -> str:
        return self.stage_keys.validation

    def listing(self) -> dict[str, object]:
        return {"id": self.id, "model": self.model.id, "repo": self.model.repo, "revision": self.source_revision,
                "recipe": self.recipe.id, "target": self.target.id, "kind": self.kind, "status": self.status,
                "key": self.key, "keys": self.stage_keys.model_dump(), "reasons": []}


class ChecksumReport(BaseModel):
    kind: Literal["checksum"] = "checksum"
    cell: str
    key: str
    files: dict[str, bool]  # each copied file: does its sha256 match the source's
    gates: list[GateResult]
    passed: bool

    def round_metrics(self) -> dict[str, Spread]:
        return {}

    def accuracy(self) -> dict[str, float]:
        return {"files_matching": sum(self.files.values()) / len(self.files)} if self.files else {}

    def objective_spread(self, objective: Objective) -> Spread | None:
        return None

    def speed_checks_harness(self) -> bool:
        return False

    def view(self) -> ReportView:
        files = TableView(caption="Files", columns=["file", "matches"],
                          rows=[[name, "yes" if ok else "NO"] for name, ok in sorted(self.files.items())])
        return ReportView(kind=self.kind, passed=self.passed, summary=f"{self.cell}: {len(self.files)} files",
                          tables=[files, gate_table(self.gates)])

    def markdown(self) -> str:
        return view_markdown(f"Checksum validation of {self.cell}", self.view())

    def plots(self, out_dir: Path) -> list[Path]:
        return []


def source_dir(source: ChecksumSource, config_dir: Path) -> Path:
    path = Path(source.path)
    return path if path.is_absolute() else (config_dir / path).resolve()


def build(cell: ChecksumCell, work: Path) -> Path:
    """Copy the source into an artefact directory, every file hashed, described by artefact.json."""
    source, out_dir = Path(cell.model.repo), work / steps.ARTEFACTS_DIR / cell.stage_keys.build[:16]
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(source, partial)
    files = [CheckpointFile(path=str(p.relative_to(partial)), size=p.stat().st_size, sha256=file_sha256(p))
             for p in sorted(partial.rglob("*")) if p.is_file()]
    artefact = Artefact(key=cell.stage_keys.build, kind=ARTEFACT_KIND, target=cell.target.id,
                        target_sm=cell.target.sm, versions={},
                        lineage=Lineage(model_id=cell.model.id, repo_id=str(source), commit_sha=cell.source_revision,
                                        checkpoint_key=cell.source_revision, recipe=cell.recipe.id),
                        files=files, created=datetime.now(timezone.utc).isoformat())
    (partial / ARTEFACT_FILE).write_text(artefact.model_dump_json(indent=2))
    shutil.rmtree(out_dir, ignore_errors=True)
    partial.rename(out_dir)
    return out_dir


def validate(cell: ChecksumCell, artefact_dir: Path) -> dict[str, object]:
    source = Path(cell.model.repo)
    files = {str(p.relative_to(artefact_dir)): file_sha256(p) == file_sha256(source / p.relative_to(artefact_dir))
             for p in sorted(artefact_dir.rglob("*")) if p.is_file() and p.name != ARTEFACT_FILE}
    matching = sum(files.values())
    gates = [GateResult(name="min_files", measured=matching, limit=cell.min_files,
                        passed=matching >= cell.min_files and matching == len(files),
                        detail="files whose copy matches the source")]
    return ChecksumReport(cell=cell.id, key=cell.key, files=files, gates=gates,
                          passed=all(g.passed for g in gates)).model_dump(mode="json")


class ChecksumKind:
    name = NAME

    def in_config(self, config: PipelineConfig) -> bool:
        return NAME in config.kinds

    def plan(self, config: PipelineConfig, config_dir: Path, catalogue: Catalogue, *,
             resolve_hub: bool = True) -> list[PlannedCell]:
        section = kind_section(config, NAME, ChecksumSection)
        assert isinstance(section, ChecksumSection)
        cells: list[PlannedCell] = []
        for source in section.sources:
            path = source_dir(source, config_dir)
            if not path.is_dir():
                raise ConfigError("checksum source directory not found", path=str(path),
                                  field=f"kinds.{NAME}.sources", hint="fix the path (relative to the config file)")
            revision = directory_digest(path)
            for target_id in section.targets:
                build_key = stage_key("checksum-build", {"source": revision, "target": target_id})
                cells.append(ChecksumCell(
                    id=f"{source.id}/checksum/{target_id}", model=ChecksumModel(id=source.id, repo=str(path)),
                    target=catalogue.target(target_id), source_revision=revision, min_files=section.min_files,
                    stage_keys=ChecksumKeys(build=build_key, validation=stage_key(
                        "checksum-validate", {"build": build_key, "min_files": section.min_files}))))
        return cells

    def preflight(self, config: PipelineConfig, config_dir: Path, catalogue: Catalogue, *,
                  parse_with_vllm: bool = True, select: CellFilter | None = None
                  ) -> tuple[list[PlannedCell], KindPreflight]:
        cells = self.plan(config, config_dir, catalogue)
        verdicts = [verdict(c.id, c.key, [Check(name="source", ok=Path(c.model.repo).is_dir(), detail=c.model.repo)],
                            invalid=False) for c in cells if select is None or select(c)]
        return cells, KindPreflight(verdicts=verdicts)

    def pool(self, cell: PlannedCell) -> str:
        return "cpu"

    def pools(self, targets: Iterable[TargetSpec]) -> set[str]:
        return {"cpu"}

    def run(self, cell: PlannedCell, context: CellContext, stage: StageRunner) -> CellRun:
        assert isinstance(cell, ChecksumCell)
        artefact_dir = stage("checksum", build, cell, context.work, key=cell.stage_keys.build,
                             done=context.work / steps.ARTEFACTS_DIR / cell.stage_keys.build[:16] / ARTEFACT_FILE)
        return CellRun(artefact_dir=artefact_dir, report=stage("verify", validate, cell, artefact_dir))

    def dispatch(self, config_path: str, cell: PlannedCell) -> Dispatch:
        return Dispatch(flow=RUN_CELL_FLOW,
                        parameters={"params": RunCellParams(config=config_path, cell=cell.id).model_dump()})

    def handover(self, config_path: str, cell: PlannedCell) -> tuple[str, Dispatch] | None:
        return None  # every stage runs on the cell's own node

    def table_row(self, cell: PlannedCell) -> tuple[str, str]:
        return "-", ""


register_kind(ChecksumKind())
register_report(NAME, ChecksumReport)
