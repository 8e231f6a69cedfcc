"""The LLM kind: a model × recipe × target × parallelism × artefact kind, quantised with ModelOpt, built for
TensorRT-LLM or vLLM and validated against vLLM serving the checkpoint. Its plan rules are
``enginesmith.core.plan``/``compat``; its stages ``pipeline.common.steps``; its flow ``build-cell``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from enginesmith.core.artefacts import ARTEFACT_FILE, COMPLETE_MARKER, QuantizedCheckpoint
from enginesmith.core.checkpoints.models import Checkpoint
from enginesmith.core.config import Catalogue, default_catalogue, load_pipeline_config
from enginesmith.core.errors import ConfigError, UserError
from enginesmith.core.plan import Cell
from enginesmith.core.specs import ARTEFACT_KINDS, ArtefactKind, GateSpec, MatrixBlock, PipelineConfig, TargetSpec
from pipeline.common import steps
from pipeline.common.params import BUILD_CELL_FLOW, BuildCellParams, RecipeName, TargetName
from pipeline.common.plan_sources import plan_loaded
from pipeline.common.protocol import (
    CellContext,
    CellFilter,
    CellRun,
    Dispatch,
    KindPreflight,
    PlannedCell,
    StageRunner,
)
from pipeline.kinds import llm_steps
from pipeline.kinds.llm_preflight import gather, judge_cell

TRANSIENT_RETRIES = 3  # a Hub or registry outage, a server that did not start
QUANTIZE_STAGE = "quantize"


def pool_for(target: TargetSpec, kind: ArtefactKind) -> str:
    """The work pool of a SKU and an artefact kind, one per environment a node needs: ``cpu``; ``gpu-<sku>`` for
    hf-quantized checkpoints (the pipeline's ModelOpt, served by vLLM and TensorRT-LLM's PyTorch backend);
    ``gpu-<sku>-engine`` for trtllm-engine builds, whose nodes run the TensorRT-LLM 1.2.1 image."""
    if target.is_cpu:
        return "cpu"
    return f"gpu-{target.id}-engine" if kind == "trtllm-engine" else f"gpu-{target.id}"


def params_for(config_path: str, cell: Cell) -> BuildCellParams:
    # A Hub model goes out at the commit the plan resolved, so build-cell keys and pulls what the nightly keyed.
    revision = cell.source_revision if not cell.model.is_local and cell.revision_pinned else None
    return BuildCellParams(config=config_path, model=cell.model.id, revision=revision,
                           recipe=RecipeName(cell.recipe.id), target=TargetName(cell.target.id), kind=cell.kind,
                           tp=cell.tp, pp=cell.pp, profile=cell.profile_name)


class LlmKind:
    name = "llm"

    def in_config(self, config: PipelineConfig) -> bool:
        return bool(config.matrix)

    def plan(self, config: PipelineConfig, config_dir: Path, catalogue: Catalogue, *,
             resolve_hub: bool = True) -> list[PlannedCell]:
        return list(plan_loaded(config, config_dir, catalogue, resolve_hub=resolve_hub).cells)

    def preflight(self, config: PipelineConfig, config_dir: Path, catalogue: Catalogue, *,
                  parse_with_vllm: bool = True, select: CellFilter | None = None
                  ) -> tuple[list[PlannedCell], KindPreflight]:
        gathered, plan, skipped = gather(config, config_dir, catalogue, parse_with_vllm=parse_with_vllm,
                                         select=select)
        verdicts = [judge_cell(cell, config, gathered) for cell in plan.cells if select is None or select(cell)]
        return list(plan.cells), KindPreflight(verdicts=verdicts, skipped=skipped, vllm_parser=gathered.vllm_parser)

    def pool(self, cell: PlannedCell) -> str:
        assert isinstance(cell, Cell)
        return pool_for(cell.target, cell.kind)

    def pools(self, targets: Iterable[TargetSpec]) -> set[str]:
        return {pool_for(target, kind) for target in targets for kind in ARTEFACT_KINDS}

    def run(self, cell: PlannedCell, context: CellContext, stage: StageRunner) -> CellRun:
        """pull → quantize (here, or on the pool of the SKU ``quantize_on`` names, handed over through the
        registry) → build → validate → tune (the config's serving sweep, once the gates passed). With
        ``until="quantize"``: pull, quantise and stash for the building node."""
        assert isinstance(cell, Cell)
        if context.until == QUANTIZE_STAGE:
            return quantize_and_stash(cell, context, stage)
        checkpoint = pull(cell, context, stage)
        quantized = obtain_quantized(cell, checkpoint, context, stage)
        llm_steps.check_quantize_quality(cell, quantized, context.config)
        work, config = context.work, context.config
        artefact_dir = stage("build", llm_steps.build, cell, quantized, work, config, key=cell.stage_keys.build,
                             done=llm_steps.built_artefact_dir(cell, work) / ARTEFACT_FILE, retries=1)
        report = stage("validate", llm_steps.validate_json, cell, artefact_dir, checkpoint, config, work,
                       retries=TRANSIENT_RETRIES)
        if cell.tuning:  # the serving profiles it is published with (a cell that failed its gates keeps its report)
            report = stage("tune", llm_steps.tune, cell, artefact_dir, config, work, report, retries=TRANSIENT_RETRIES)
        return CellRun(artefact_dir=artefact_dir, report=report)

    def dispatch(self, config_path: str, cell: PlannedCell) -> Dispatch:
        assert isinstance(cell, Cell)
        return Dispatch(flow=BUILD_CELL_FLOW,
                        parameters={"params": params_for(config_path, cell).model_dump(mode="json")})

    def handover(self, config_path: str, cell: PlannedCell) -> tuple[str, Dispatch] | None:
        assert isinstance(cell, Cell)
        if cell.quantize_target is None:
            return None
        pool = pool_for(cell.quantize_target, cell.kind)
        if pool == pool_for(cell.target, cell.kind):
            return None
        params = params_for(config_path, cell).model_copy(update={"until": QUANTIZE_STAGE})
        return pool, Dispatch(
            flow=BUILD_CELL_FLOW, parameters={"params": params.model_dump(mode="json")})

    def table_row(self, cell: PlannedCell) -> tuple[str, str]:
        assert isinstance(cell, Cell)
        awq = cell.awq_block
        note = f"AWQ {awq.reason}" if awq is not None and awq.size not in (None, awq.preferred) else ""
        return f"tp{cell.tp}" + (f"pp{cell.pp}" if cell.pp > 1 else ""), note


LLM = LlmKind()


def pull(cell: Cell, context: CellContext, stage: StageRunner) -> Checkpoint:
    # A local model's pull is a digest of its directory: kept while the plan's key for it holds.
    return stage("pull", llm_steps.pull, context.config_path, cell,
                 key=cell.stage_keys.checkpoint if cell.model.is_local else None, retries=TRANSIENT_RETRIES)


def quantize_here(cell: Cell, checkpoint: Checkpoint, context: CellContext, stage: StageRunner) -> QuantizedCheckpoint:
    return stage(QUANTIZE_STAGE, llm_steps.quantize, cell, checkpoint, context.work, key=cell.stage_keys.quantize,
                 done=llm_steps.quantized_dir(cell, context.work) / COMPLETE_MARKER)


def quantize_and_stash(cell: Cell, context: CellContext, stage: StageRunner) -> CellRun:
    """This node quantises the cell for another that builds it: pull, quantise, stash in the registry."""
    key = cell.stage_keys.quantize
    if llm_steps.read_stashed(cell, context.config) is not None:
        return CellRun(stopped=f"quantised already (stashed under key {key[:12]})")
    quantized = quantize_here(cell, pull(cell, context, stage), context, stage)
    stage("stash-quantized", llm_steps.stash_quantized, quantized, context.config, retries=TRANSIENT_RETRIES)
    return CellRun(stopped=f"quantised here and stashed for the build node: key {key[:12]}")


def quantize_pool(cell: Cell, context: CellContext) -> str | None:
    """The pool that quantises the cell when it is not the one running it: only for a run from a deployment
    (an in-process run quantises in place), and only where the config's quantize_on names another SKU."""
    if cell.quantize_target is None or context.pool is None:
        return None
    pool = pool_for(cell.quantize_target, cell.kind)
    return None if pool == context.pool else pool


def obtain_quantized(cell: Cell, checkpoint: Checkpoint, context: CellContext,
                     stage: StageRunner) -> QuantizedCheckpoint:
    """The cell's quantised checkpoint: from this node's work directory, from the registry where another node
    stashed it, or quantised there first (quantize_on), else quantised here."""
    pool = quantize_pool(cell, context)
    if pool is None or (llm_steps.quantized_dir(cell, context.work) / COMPLETE_MARKER).is_file():
        return quantize_here(cell, checkpoint, context, stage)
    fetch = (llm_steps.fetch_stashed_if_any, cell, context.work, context.config)
    fetched = stage("fetch-quantized", *fetch, retries=TRANSIENT_RETRIES)
    if fetched is None:
        stage.elsewhere(pool, QUANTIZE_STAGE)
        fetched = stage("fetch-quantized", *fetch, retries=TRANSIENT_RETRIES)
    if fetched is None:
        raise UserError(f"cell {cell.id}: the quantize run on {pool} finished but stashed nothing under key "
                        f"{cell.stage_keys.quantize[:12]}", where=steps.registry_url(context.config),
                        hint="check that both pools' workers use the same registry (ENGINESMITH_REGISTRY)")
    return fetched


def cell_for(params: BuildCellParams, *, resolve_hub: bool = True) -> tuple[Path, PipelineConfig, Cell]:
    """The one LLM cell the form asks for, planned against the config (overrides applied); ``resolve_hub=False``
    keys a Hub model at its configured revision without asking the Hub (the fleet bench's offline doubles)."""
    config_path = Path(params.config)
    catalogue = default_catalogue()
    config = load_pipeline_config(config_path, catalogue)
    if params.model not in {m.id for m in config.models}:
        raise ConfigError(f"model {params.model!r} is not in {config_path}", field="params.model",
                          hint=f"models there: {', '.join(m.id for m in config.models)}")
    models = [m.model_copy(update={"revision": params.revision}) if params.revision and m.id == params.model else m
              for m in config.models]
    gates = GateSpec.model_validate({
        **config.gates.model_dump(),
        **{k: v for k, v in (("min_throughput_ratio", params.min_throughput_ratio),
                             ("max_tpot_ratio", params.max_tpot_ratio)) if v is not None},
    })
    if params.max_accuracy_drop_points is not None:
        gates = gates.model_copy(update={"max_accuracy_drop_points": {
            **gates.max_accuracy_drop_points, params.recipe.value: params.max_accuracy_drop_points}})
    if params.profile != "default" and params.profile not in config.profiles:
        raise ConfigError(f"build profile {params.profile!r} is not in {config_path}", field="params.profile",
                          hint=f"profiles there: default{''.join(', ' + name for name in config.profiles)}")
    block = MatrixBlock(models=[params.model], recipes=[params.recipe.value], targets=[params.target.value],
                        kinds=[params.kind], tp=[params.tp], pp=[params.pp], profile=params.profile)
    single = PipelineConfig.model_validate({**config.model_dump(), "models": [m.model_dump() for m in models],
                                            "matrix": [block.model_dump()], "gates": gates.model_dump()})
    # Local model paths stay relative to the original config file.
    plan = plan_loaded(single, config_path.parent, catalogue, resolve_hub=resolve_hub)
    return config_path, single, plan.cells[0]
