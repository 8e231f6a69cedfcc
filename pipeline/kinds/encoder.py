"""The encoder kind: an embedding model × encoder recipe × target × artefact kind, exported to ONNX, quantised
with ModelOpt's ONNX quantisation, built for onnxruntime (or TensorRT), validated against vLLM's embeddings of the
checkpoint. Its plan rules are ``pipeline.kinds.encoder_plan``; its flow the generic ``run-cell``."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from pathlib import Path

from enginesmith.core.artefacts import ARTEFACT_FILE, COMPLETE_MARKER
from enginesmith.core.assets import EMBEDDING_CALIBRATION_FILE
from enginesmith.core.checkpoints.digest import file_sha256
from enginesmith.core.checkpoints.encoder_layout import read_layout
from enginesmith.core.checkpoints.pull import local_checkpoint
from enginesmith.core.config import Catalogue
from enginesmith.core.errors import ConfigError
from enginesmith.core.plan import LOCAL_MODEL_HINT
from enginesmith.core.specs import PipelineConfig, TargetSpec
from pipeline.common import steps
from pipeline.common.params import RUN_CELL_FLOW, RunCellParams
from pipeline.common.plan_sources import hub_revision, model_source
from pipeline.common.protocol import (
    CellContext,
    CellFilter,
    CellRun,
    Dispatch,
    KindPreflight,
    PlannedCell,
    StageRunner,
)
from pipeline.common.verdicts import Check, verdict
from pipeline.kinds import encoder_steps as stages
from pipeline.kinds.encoder_plan import EncoderCell, plan_encoders


def plan_encoders_loaded(config: PipelineConfig, config_dir: Path, catalogue: Catalogue, *,
                         resolve_hub: bool = True) -> list[EncoderCell]:
    """The encoder cells of a loaded config, each encoder's source resolved as ``plan_loaded`` resolves an LLM's
    (a local directory by its content digest), keyed with the calibration sentences the repo ships."""
    revisions: dict[str, str] = {}
    layouts: dict[str, dict[str, object]] = {}
    for encoder in config.encoders:
        source = model_source(encoder, config_dir)
        if encoder.is_local:
            if not Path(source).is_dir():
                raise ConfigError("local encoder directory not found", path=source,
                                  field=f"encoders.{encoder.id}.repo", hint=LOCAL_MODEL_HINT)
            revisions[encoder.id] = local_checkpoint(Path(source)).commit_sha
            layouts[encoder.id] = read_layout(Path(source)).model_dump()
        else:
            resolved = hub_revision(source, encoder.revision, resolve_hub=resolve_hub)
            if resolved is not None:
                revisions[encoder.id] = resolved
    return plan_encoders(config, catalogue, calibration_fingerprint="sha256:" + file_sha256(EMBEDDING_CALIBRATION_FILE),
                         source_revisions=revisions, layouts=layouts)


def encoder_pool(target: TargetSpec) -> str:
    """onnx artefacts build and validate on the cpu pool; a TensorRT engine on its SKU's GPUs."""
    return "cpu" if target.is_cpu else f"gpu-{target.id}"


class EncoderKind:
    name = "encoder"

    def in_config(self, config: PipelineConfig) -> bool:
        return bool(config.encoder_matrix)

    def plan(self, config: PipelineConfig, config_dir: Path, catalogue: Catalogue, *,
             resolve_hub: bool = True) -> list[PlannedCell]:
        return list(plan_encoders_loaded(config, config_dir, catalogue, resolve_hub=resolve_hub))

    def preflight(self, config: PipelineConfig, config_dir: Path, catalogue: Catalogue, *,
                  parse_with_vllm: bool = True, select: CellFilter | None = None
                  ) -> tuple[list[PlannedCell], KindPreflight]:
        cells = plan_encoders_loaded(config, config_dir, catalogue)
        runtime = Check(name="runtime", ok=True, detail="onnxruntime installed here")
        skipped = []
        if importlib.util.find_spec("onnxruntime") is None:
            runtime = Check(name="runtime", ok=None, detail="onnxruntime is not installed here (it must be where the "
                                                            "cell builds and validates)")
            skipped.append(f"runtime: {runtime.detail}")
        verdicts = []
        for cell in cells if select is None else filter(select, cells):
            checks = [Check(name=f"rule {v.rule}", ok=False, detail=v.message) for v in cell.violations]
            checks.append(Check(name="model", ok=True, detail=f"{cell.model.repo}@{cell.source_revision[:19]}"))
            checks.append(runtime)
            verdicts.append(verdict(cell.id, cell.key, checks, invalid=bool(cell.violations)))
        return list(cells), KindPreflight(verdicts=verdicts, skipped=skipped)

    def pool(self, cell: PlannedCell) -> str:
        return encoder_pool(cell.target)

    def pools(self, targets: Iterable[TargetSpec]) -> set[str]:
        return {encoder_pool(target) for target in targets if target.is_cpu}

    def run(self, cell: PlannedCell, context: CellContext, stage: StageRunner) -> CellRun:
        """pull → export → quantise → build → validate, each kept in the work directory under its stage key."""
        assert isinstance(cell, EncoderCell)
        work, config, keys = context.work, context.config, cell.stage_keys
        checkpoint = stage("pull", steps.pull, context.config_path, cell, retries=3)
        exported = stage("export-onnx", stages.export, cell, checkpoint, work, config, key=keys.export,
                         done=stages.export_dir(cell, work) / COMPLETE_MARKER)
        graph = stage("quantize-onnx", stages.quantize, cell, checkpoint, exported, work, config, key=keys.quantize,
                      done=stages.encoder_graph_dir(cell, work) / COMPLETE_MARKER)
        artefact_dir = stage("build-encoder", stages.build, cell, graph, work, config, key=keys.build,
                             done=work / steps.ARTEFACTS_DIR / keys.build[:16] / ARTEFACT_FILE)
        report = stage("validate-encoder", stages.validate, cell, artefact_dir, graph, config, work, retries=1)
        return CellRun(artefact_dir=artefact_dir, report=report)

    def dispatch(self, config_path: str, cell: PlannedCell) -> Dispatch:
        params = RunCellParams(config=config_path, cell=cell.id)
        return Dispatch(flow=RUN_CELL_FLOW, parameters={"params": params.model_dump(mode="json")})

    def handover(self, config_path: str, cell: PlannedCell) -> tuple[str, Dispatch] | None:
        return None  # every stage runs on the cell's own node

    def table_row(self, cell: PlannedCell) -> tuple[str, str]:
        return "-", ""


ENCODER = EncoderKind()
