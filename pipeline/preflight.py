"""``enginesmith preflight CONFIG``: every check short of a GPU, for every cell of every kind a config plans, so a
matrix's first night does not discover them one at a time on GPUs. The nightly runs the same checks before it
dispatches. Each kind judges its own cells (``CellKind.preflight``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from enginesmith.core.config import Catalogue, load_pipeline_config
from enginesmith.core.specs import PipelineConfig
from pipeline.common.protocol import CellFilter, CellKind, PlannedCell
from pipeline.common.verdicts import CellPreflight, CellStatus
from pipeline.kind_registry import kinds_of


class PreflightReport(BaseModel):
    config: str
    offline: bool
    vllm_parser: str | None  # the vLLM whose parser read the serve commands; None when it could not run here
    skipped: list[str]  # checks not made for any cell, and why
    cells: list[CellPreflight]

    @property
    def blocked(self) -> list[CellPreflight]:
        return [c for c in self.cells if c.status == "blocked"]

    def count(self, status: CellStatus) -> int:
        return sum(c.status == status for c in self.cells)


def run_preflight(config_path: Path, catalogue: Catalogue, *, parse_with_vllm: bool = True,
                  config: PipelineConfig | None = None, select: CellFilter | None = None
                  ) -> tuple[PipelineConfig, list[tuple[CellKind, PlannedCell]], PreflightReport]:
    """Load (unless ``config`` is the file, loaded), plan and judge every kind's cells, or those ``select`` takes
    (the report lists those alone). The planned cells come back too, each with its kind: they carry the keys the
    nightly dispatches."""
    from huggingface_hub import constants

    config = config or load_pipeline_config(config_path, catalogue, check_tasks=False)
    planned: list[tuple[CellKind, PlannedCell]] = []
    verdicts: list[CellPreflight] = []
    skipped: list[str] = []
    parser: str | None = None
    for kind in kinds_of(config):
        cells, judged = kind.preflight(config, config_path.parent, catalogue, parse_with_vllm=parse_with_vllm,
                                       select=select)
        planned += [(kind, cell) for cell in cells]
        verdicts += judged.verdicts
        skipped += judged.skipped
        parser = parser or judged.vllm_parser
    report = PreflightReport(config=str(config_path), offline=bool(constants.HF_HUB_OFFLINE), vllm_parser=parser,
                             skipped=skipped, cells=verdicts)
    return config, planned, report
