"""The ``build-cell`` flow: pull → quantize → build → validate → publish, each a task keyed by its stage key.

Retries are for transient failures only (a server that did not start, the network); a bad config or a
failed gate fails at once. A failed gate publishes nothing and leaves the run Failed with the verdict.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext

from builders.stage import read_artefact
from enginesmith.artefacts import COMPLETE_MARKER, QuantizedCheckpoint
from enginesmith.checkpoints.models import Checkpoint
from enginesmith.config import default_catalogue, load_pipeline_config
from enginesmith.errors import ConfigError, TransientError, UserError
from enginesmith.plan import Cell
from enginesmith.specs import GateSpec, MatrixBlock, PipelineConfig
from flows.history import record_cell
from flows.params import BuildCellParams, CellSummary
from pipeline import steps
from pipeline.plan_sources import plan_loaded

RETRY_DELAYS_S: list[float] = [10, 60, 300]


class GateFailed(UserError):
    """The candidate did not pass its gates: nothing is published."""


def retry_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a transient failure (or an unexpected exception); never a user error such as a bad config."""
    try:
        state.result()
    except TransientError:
        return True
    except UserError:
        return False
    except Exception:
        return True
    return False


def key_if(path: Path, key: str) -> str | None:
    """A cached result is only worth having while its files are on disk; otherwise run the stage again."""
    return key if path.exists() else None


def _pull_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    return parameters["cell"].stage_keys.checkpoint if parameters["cell"].model.is_local else None


def _quantize_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    cell: Cell = parameters["cell"]
    return key_if(parameters["work"] / steps.QUANTIZED_DIR / cell.stage_keys.quantize[:16] / COMPLETE_MARKER,
                   cell.stage_keys.quantize)


def _build_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
    cell: Cell = parameters["cell"]
    artefact_json = parameters["work"] / steps.ARTEFACTS_DIR / cell.stage_keys.build[:16] / "artefact.json"
    return key_if(artefact_json, cell.stage_keys.build)


@task(name="pull", retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_transient, cache_key_fn=_pull_key, persist_result=True)
def pull_task(config_path: Path, cell: Cell) -> Checkpoint:
    checkpoint = steps.pull(config_path, cell)
    logger = get_run_logger()
    for file in checkpoint.files:
        logger.info("checkpoint file %s (%s bytes)", file.path, f"{file.size:,}")
    logger.info("pulled %s@%s: %s", checkpoint.repo_id, checkpoint.commit_sha[:12], checkpoint.local_path)
    return checkpoint


@task(name="quantize", cache_key_fn=_quantize_key, persist_result=True)
def quantize_task(cell: Cell, checkpoint: Checkpoint, work: Path) -> QuantizedCheckpoint:
    get_run_logger().info("quantising with %s (calibration %s)", cell.recipe.id, cell.calibration)
    quantized = steps.quantize(cell, checkpoint, work)
    if quantized.quality:
        get_run_logger().info("quality: %s", quantized.quality.model_dump_json())
    return quantized


@task(name="stash-quantized", retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_transient, cache_policy=NO_CACHE)
def stash_task(quantized: QuantizedCheckpoint, config: PipelineConfig) -> None:
    result = steps.stash_quantized(quantized, config)
    get_run_logger().info("stashed quantised checkpoint %s in %s (%d new blobs, %d reused%s)", result.key[:12],
                          result.registry, result.uploaded_blobs, result.reused_blobs,
                          "" if result.created else "; its record was there already")


# Never cached: the same call returns None before the quantize run and the checkpoint after it.
@task(name="fetch-quantized", retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_transient, cache_policy=NO_CACHE)
def fetch_quantized_task(cell: Cell, work: Path, config: PipelineConfig) -> QuantizedCheckpoint | None:
    record = steps.read_stashed(cell, config)
    if record is None:
        return None
    quantized = steps.fetch_stashed(cell, record, work, config)
    get_run_logger().info("fetched quantised checkpoint %s, quantised on %s at %s", cell.stage_keys.quantize[:12],
                          record.node, record.stashed)
    return quantized


QUANTIZE_TIMEOUT_S = 6 * 3600


def quantize_elsewhere(params: BuildCellParams, cell: Cell, pool: str) -> None:
    """Run this cell's quantize stage on ``pool`` (its build-cell deployment, ``until=quantize``) and wait."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.deployments import run_deployment

    get_run_logger().info("cell %s quantises on pool %s (quantize_on: %s)", cell.id, pool,
                          cell.quantize_target.id if cell.quantize_target else "")
    flow_run = run_deployment(f"build-cell/{pool}", timeout=QUANTIZE_TIMEOUT_S, poll_interval=2,
                              parameters={"params": params.model_copy(update={"until": "quantize"})
                                          .model_dump(mode="json")})
    assert isinstance(flow_run, FlowRun)
    state = flow_run.state
    if state is not None and state.is_completed():
        return
    where = f"cell {cell.id}: its quantize run {flow_run.name} on pool {pool!r}"
    if state is not None and state.is_failed():  # the stage's own error (a recipe, the checkpoint): not retried
        raise UserError(f"{where} failed: {state.message or ''}"[:1000], where=f"build-cell/{pool}",
                        hint="read that run's log")
    what = "no worker started it" if state is None or state.type.value in ("SCHEDULED", "PENDING") else \
        f"it ended {state.type.value}: {state.message or ''}"[:500]
    raise TransientError(f"{where} did not finish: {what}",
                         hint=f"start a worker on it: prefect worker start --pool {pool}")


def quantize_pool(cell: Cell) -> str | None:
    """The pool that quantises the cell when it is not the one running it: only for a run from a deployment
    (an in-process run quantises in place), and only where the config's quantize_on names another SKU."""
    from prefect.runtime import deployment

    if cell.quantize_target is None or deployment.id is None:
        return None
    from flows.nightly import pool_for  # flows.nightly imports this module

    pool = pool_for(cell.quantize_target, cell.kind)
    return None if pool == deployment.name else pool  # build-cell deployments are named after their pool


def obtain_quantized(params: BuildCellParams, cell: Cell, checkpoint: Checkpoint, work: Path,
                     config: PipelineConfig) -> QuantizedCheckpoint:
    """The cell's quantised checkpoint: from this node's work directory, from the registry where another node
    stashed it, or quantised there first (quantize_on), else quantised here."""
    pool = quantize_pool(cell)
    if pool is None or (steps.quantized_dir(cell, work) / COMPLETE_MARKER).is_file():
        return quantize_task(cell, checkpoint, work)
    fetched = fetch_quantized_task(cell, work, config)
    if fetched is None:
        quantize_elsewhere(params, cell, pool)
        fetched = fetch_quantized_task(cell, work, config)
    if fetched is None:
        raise UserError(f"cell {cell.id}: the quantize run on {pool} finished but stashed nothing under key "
                        f"{cell.stage_keys.quantize[:12]}", where=steps.registry_url(config),
                        hint="check that both pools' workers use the same registry (ENGINESMITH_REGISTRY)")
    return fetched


@task(name="build", retries=1, retry_delay_seconds=30, retry_condition_fn=retry_transient,
      cache_key_fn=_build_key, persist_result=True)
def build_task(cell: Cell, quantized: QuantizedCheckpoint, work: Path, config: PipelineConfig) -> Path:
    get_run_logger().info("building %s for %s", cell.kind, cell.target.id)
    return steps.build(cell, quantized, work, config)


@task(name="validate", retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_transient)
def validate_task(cell: Cell, artefact_dir: Path, checkpoint: Checkpoint, config: PipelineConfig,
                  work: Path) -> dict[str, Any]:
    report = steps.validate(cell, artefact_dir, checkpoint, config, work)
    return report.model_dump(mode="json")


@task(name="publish", retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_transient)
def publish_task(cell: Cell, artefact_dir: Path, report: dict[str, Any], config: PipelineConfig) -> str:
    result = steps.publish(cell.key, artefact_dir, report, config)
    get_run_logger().info("published %s/%s (%d new blobs, %d reused) to %s", result.model, result.key[:12],
                          result.uploaded_blobs, result.reused_blobs, result.registry)
    return result.key


def cell_for(params: BuildCellParams) -> tuple[Path, PipelineConfig, Cell]:
    """The one cell the parameters ask for, planned against the config (overrides applied)."""
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
    plan = plan_loaded(single, config_path.parent, catalogue)
    return config_path, single, plan.cells[0]


def worker_name() -> str:
    """The worker that started this run: a process worker hands its name to the runs it starts (Prefect's
    attribution variable); empty for a run started in-process."""
    return os.environ.get("PREFECT__WORKER_NAME", "")


@flow(name="build-cell", persist_result=True)
def build_cell(params: BuildCellParams = BuildCellParams()) -> CellSummary:
    logger = get_run_logger()
    config_path, config, cell = cell_for(params)
    if cell.status == "invalid":
        raise ConfigError(f"cell {cell.id} cannot be built: {cell.reason}", field="params")
    if steps.published(config, cell.model.id, cell.key):
        logger.info("cell %s (key %s) is already in the registry: nothing to do", cell.id, cell.key[:12])
        return CellSummary(cell=cell.id, status="cached", key=cell.key, worker=worker_name())
    work = steps.workdir(config)
    if params.until == "quantize":
        return quantize_and_stash(cell, config_path, config, work)
    try:
        return build_validate_publish(params, cell, config_path, config, work)
    except GateFailed:
        raise  # recorded with its report
    except Exception as exc:
        record_cell(config, cell, "failed", reason=exc.render() if isinstance(exc, UserError) else repr(exc))
        raise


def build_validate_publish(params: BuildCellParams, cell: Cell, config_path: Path, config: PipelineConfig,
                           work: Path) -> CellSummary:
    logger = get_run_logger()
    checkpoint = pull_task(config_path, cell)
    quantized = obtain_quantized(params, cell, checkpoint, work, config)
    artefact_dir = build_task(cell, quantized, work, config)
    report = validate_task(cell, artefact_dir, checkpoint, config, work)
    markdown = Path(steps.workdir(config) / steps.REPORTS_DIR / cell.stage_keys.validation[:16] / "report.md")
    create_markdown_artifact(markdown=markdown.read_text(), key=_artifact_key(cell, "report"),
                             description=f"validation of {cell.id}")
    create_table_artifact(table=_gate_rows(report), key=_artifact_key(cell, "gates"),
                          description=f"gates of {cell.id}")
    comparison = report["comparison"]
    if not report["passed"]:
        failed = [g for g in report["gates"] if not g["passed"]]
        verdict = "; ".join(f"{g['name']} = {g['measured']} (limit {g['limit']})" for g in failed)
        record_cell(config, cell, "gate-failed", report=report, artefact_dir=artefact_dir, reason=verdict)
        raise GateFailed(f"cell {cell.id} failed its gates: {verdict}. Nothing was published.")
    publish_task(cell, artefact_dir, report, config)
    record_cell(config, cell, "built", report=report, artefact_dir=artefact_dir)
    artefact = read_artefact(artefact_dir)
    logger.info("cell %s built and published (%d files)", cell.id, len(artefact.files) if artefact else 0)
    return CellSummary(cell=cell.id, status="built", key=cell.key, throughput_ratio=comparison["throughput_ratio"],
                       tpot_ratio=comparison["tpot_ratio"], worker=worker_name())


def quantize_and_stash(cell: Cell, config_path: Path, config: PipelineConfig, work: Path) -> CellSummary:
    """This node quantises the cell for another that builds it: pull, quantise, stash in the registry."""
    key = cell.stage_keys.quantize
    if steps.read_stashed(cell, config) is None:
        checkpoint = pull_task(config_path, cell)
        stash_task(quantize_task(cell, checkpoint, work), config)
        reason = f"quantised here and stashed for the build node: key {key[:12]}"
    else:
        reason = f"quantised already (stashed under key {key[:12]})"
    return CellSummary(cell=cell.id, status="quantized", key=key, reason=reason, worker=worker_name())


def _artifact_key(cell: Cell, what: str) -> str:
    # Artifact keys: lowercase letters, digits and dashes.
    return f"{what}-{cell.key[:12]}"


def _gate_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    from validation.report import GATE_COLUMNS, ValidationReport, gate_rows

    return [dict(zip(GATE_COLUMNS, row, strict=True)) for row in gate_rows(ValidationReport.model_validate(report))]
