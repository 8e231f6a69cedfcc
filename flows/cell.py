"""The flows that build one cell: ``build-cell`` (an LLM cell from a typed form: model, recipe, target, kind,
parallelism, gate overrides) and ``run-cell`` (any kind's cell by its id). Both plan the cell, then run its kind's
stages in order (``CellKind.run``), each a Prefect task cached by its stage key, and publish what passes.

Retries are for transient failures only (a server that did not start, the network); a bad config or a failed gate
fails at once. A failed gate publishes nothing and leaves the run Failed with the verdict.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext

import enginesmith.entry  # noqa: F401  (first: our components, never a same-named folder where Prefect runs)
from enginesmith.core.config import default_catalogue, load_pipeline_config
from enginesmith.core.errors import ConfigError, TransientError, UserError
from enginesmith.core.reports import GATE_COLUMNS, gate_rows, parse_report
from enginesmith.core.specs import PipelineConfig
from flows.history import record_cell
from pipeline.common import steps
from pipeline.common.params import BUILD_CELL_FLOW, RUN_CELL_FLOW, BuildCellParams, CellSummary, RunCellParams
from pipeline.common.protocol import CellContext, CellKind, PlannedCell
from pipeline.kind_registry import find_planned, planned_from_form

RETRY_DELAYS_S: list[float] = [10, 60, 300]
STAGE_TIMEOUT_S = 6 * 3600  # a stage run on another pool (quantize_on), waited for
T = TypeVar("T")


_FIRST_TRANSIENT: dict[str, str] = {}  # task run id → the transient error of its first failed try (same process)


def remember_transient(error: TransientError) -> None:
    from prefect.runtime import task_run

    _FIRST_TRANSIENT.setdefault(str(task_run.id), error.render().splitlines()[0][:300])  # without its hint


def tried_again(what: str) -> str:
    """In a task that just succeeded: what it retried and why, for the night's summary ('' on its first try)."""
    from prefect.runtime import task_run

    first = _FIRST_TRANSIENT.pop(str(task_run.id), "")
    return f"{what} succeeded on try {task_run.run_count} after: {first}" if task_run.run_count > 1 else ""


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


class PrefectStages:
    """Each of a kind's stages as a Prefect task: cached under its stage key while its output is on disk (a
    result is only worth having while its files are), retried on transient errors, never on a user's."""

    def __init__(self, flow_name: str, parameters_until: Callable[[str], dict[str, Any]]) -> None:
        self.flow_name = flow_name
        self.parameters_until = parameters_until

    def __call__(self, name: str, fn: Callable[..., T], *args: Any, key: str | None = None,
                 done: Path | None = None, retries: int = 0) -> T:
        def cache_key(context: TaskRunContext, parameters: dict[str, Any]) -> str | None:
            return key if done is None or done.exists() else None

        options: dict[str, Any] = {"name": name, "retries": retries, "retry_condition_fn": retry_transient,
                                   "retry_delay_seconds": RETRY_DELAYS_S[:retries] or 0}
        if key is None:
            options["cache_policy"] = NO_CACHE
        else:
            options |= {"cache_key_fn": cache_key, "persist_result": True}
        started = time.monotonic()
        result = task(fn, **options)(*args)
        get_run_logger().info("stage %s done in %.1f s", name, time.monotonic() - started)
        return result

    def elsewhere(self, pool: str, until: str) -> None:
        from prefect.client.schemas.objects import FlowRun
        from prefect.deployments import run_deployment

        get_run_logger().info("stages up to %s run on pool %s", until, pool)
        flow_run = run_deployment(f"{self.flow_name}/{pool}", timeout=STAGE_TIMEOUT_S, poll_interval=2,
                                  parameters=self.parameters_until(until))
        assert isinstance(flow_run, FlowRun)
        state = flow_run.state
        if state is not None and state.is_completed():
            return
        where = f"its {until} run {flow_run.name} on pool {pool!r}"
        if state is not None and state.is_failed():  # the stage's own error (a recipe, the checkpoint): not retried
            raise UserError(f"{where} failed: {state.message or ''}"[:1000], where=f"{self.flow_name}/{pool}",
                            hint="read that run's log")
        what = "no worker started it" if state is None or state.type.value in ("SCHEDULED", "PENDING") else \
            f"it ended {state.type.value}: {state.message or ''}"[:500]
        raise TransientError(f"{where} did not finish: {what}",
                             hint=f"start a worker on it: prefect worker start --pool {pool}")


def worker_name() -> str:
    """The worker that started this run: a process worker hands its name to the runs it starts (Prefect's
    attribution variable); empty for a run started in-process."""
    return os.environ.get("PREFECT__WORKER_NAME", "")


def running_pool() -> str | None:
    """The pool of the deployment running this flow (cell deployments are named after their pool); None when the
    flow runs in-process."""
    from prefect.runtime import deployment

    return deployment.name if deployment.id is not None else None


def run_planned(kind: CellKind, cell: PlannedCell, config_path: Path, config: PipelineConfig, stages: PrefectStages,
                *, until: str | None = None) -> CellSummary:
    """Run a planned cell's stages and publish it if it passes; every way it ends is recorded in its history."""
    logger = get_run_logger()
    if cell.status == "invalid":
        raise ConfigError(f"cell {cell.id} cannot be built: {cell.reason}", field="params")
    found, checked_again = check_registry(config, cell.model.id, cell.key)
    if found:
        logger.info("cell %s (key %s) is already in the registry: nothing to do", cell.id, cell.key[:12])
        return CellSummary(cell=cell.id, status="cached", key=cell.key, worker=worker_name())
    context = CellContext(config_path=config_path, config=config, work=steps.workdir(config), until=until,
                          pool=running_pool())
    try:
        run = kind.run(cell, context, stages)
        if run.artefact_dir is None or run.report is None:
            return CellSummary(cell=cell.id, status="quantized", key=cell.key, reason=run.stopped,
                               worker=worker_name())
        summary = publish_if_passed(cell, run.artefact_dir, run.report, config)
        return summary.model_copy(update={"reason": "; ".join(filter(None, [checked_again, summary.reason]))})
    except GateFailed:
        raise  # recorded with its report
    except Exception as exc:
        record_cell(config, cell, "failed", reason=exc.render() if isinstance(exc, UserError) else repr(exc))
        raise


def publish_if_passed(cell: PlannedCell, artefact_dir: Path, report: dict[str, Any],
                      config: PipelineConfig) -> CellSummary:
    parsed = parse_report(report)
    if parsed is None or isinstance(parsed, str):
        raise UserError(f"cell {cell.id}: its validation wrote a report this version cannot read: {parsed}",
                        where=cell.id, hint="the kind's report model must be registered (enginesmith.core.reports)")
    artifact_key = cell.key[:12]  # artifact keys: lowercase letters, digits and dashes
    create_markdown_artifact(markdown=parsed.markdown(), key=f"report-{artifact_key}",
                             description=f"validation of {cell.id}")
    create_table_artifact(table=[dict(zip(GATE_COLUMNS, row, strict=True)) for row in gate_rows(parsed.gates)],
                          key=f"gates-{artifact_key}", description=f"gates of {cell.id}")
    if not parsed.passed:
        failed = [g for g in parsed.gates if g.failed]
        verdict = "; ".join(f"{g.name} = {g.measured} (limit {g.limit})" for g in failed)
        record_cell(config, cell, "gate-failed", report=report, artefact_dir=artefact_dir, reason=verdict)
        raise GateFailed(f"cell {cell.id} failed its gates: {verdict}. Nothing was published.")
    signer, published_again = publish_task(cell.key, artefact_dir, report, config)
    record_cell(config, cell, "built", report=report, artefact_dir=artefact_dir, signer=signer)
    get_run_logger().info("cell %s built and published", cell.id)
    ratios = parsed.round_metrics()
    return CellSummary(cell=cell.id, status="built", key=cell.key,
                       throughput_ratio=ratios["throughput_ratio"].median if "throughput_ratio" in ratios else None,
                       tpot_ratio=ratios["tpot_ratio"].median if "tpot_ratio" in ratios else None,
                       reason="; ".join(filter(None, [parsed.view().calibration_fault, published_again])),
                       worker=worker_name())


@task(name="check-registry", retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_transient, cache_policy=NO_CACHE)
def check_registry(config: PipelineConfig, model_id: str, key: str) -> tuple[bool, str]:
    """Is the cell's key already published (so its run costs no GPU time)? A registry that does not answer is asked
    again as a publish is. Returns (found, what was retried and why)."""
    try:
        found = steps.published(config, model_id, key)
    except TransientError as error:
        remember_transient(error)
        raise
    return found, tried_again("the registry check")


@task(name="publish", retries=len(RETRY_DELAYS_S), retry_delay_seconds=RETRY_DELAYS_S,
      retry_condition_fn=retry_transient)
def publish_task(key: str, artefact_dir: Path, report: dict[str, Any], config: PipelineConfig
                 ) -> tuple[str | None, str]:
    """Publish the cell's artefact; returns the fingerprint of the key that signed it (None: unsigned) and what was
    retried and why."""
    try:
        result = steps.publish(key, artefact_dir, report, config)
    except TransientError as error:
        remember_transient(error)
        raise
    signed = f", signed by key {result.signer[:16]}" if result.signer else ""
    get_run_logger().info("published %s/%s (%d new blobs, %d reused) to %s%s", result.model, result.key[:12],
                          result.uploaded_blobs, result.reused_blobs, result.registry, signed)
    for change in result.channels:
        if change.held:  # published all the same: a cell that validated does not fail for a channel left vouched
            get_run_logger().warning("%s", change.held)
    return result.signer, tried_again("the publish")


@flow(name=BUILD_CELL_FLOW, persist_result=True)
def build_cell(params: BuildCellParams = BuildCellParams()) -> CellSummary:
    kind, config_path, config, cell = planned_from_form(params)

    def until(stage: str) -> dict[str, Any]:
        return {"params": params.model_copy(update={"until": stage}).model_dump(mode="json")}

    return run_planned(kind, cell, config_path, config, PrefectStages(BUILD_CELL_FLOW, until),
                       until=None if params.until == "publish" else params.until)


@flow(name=RUN_CELL_FLOW, persist_result=True)
def run_cell(params: RunCellParams = RunCellParams()) -> CellSummary:
    config_path = Path(params.config)
    catalogue = default_catalogue()
    config = load_pipeline_config(config_path, catalogue)
    kind, cell = find_planned(config, config_path.parent, catalogue, params.cell)

    def until(stage: str) -> dict[str, Any]:
        return {"params": params.model_copy(update={"until": stage}).model_dump(mode="json")}

    return run_planned(kind, cell, config_path, config, PrefectStages(RUN_CELL_FLOW, until), until=params.until)
