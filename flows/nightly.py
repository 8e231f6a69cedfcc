"""The ``nightly`` flow: plan the matrix, skip cells already in the registry, dispatch the rest to the
``build-cell`` deployment on each cell's work pool (or run them here, ``dispatch="inline"``), and summarise
every cell. One failing cell never stops the others; a cell no worker picks up times out with a reason; a cell
whose run crashed (its worker's node died: the server marks a run Crashed when its heartbeats stop, see
``flows.deploy``) is dispatched once more, then reported failed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, task, unmapped
from prefect.artifacts import create_table_artifact
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.futures import PrefectFuture
from prefect.states import Cancelled, State

import enginesmith.entry  # noqa: F401  (first: our components, never a same-named folder where Prefect runs)
from enginesmith.core.config import Catalogue, default_catalogue, load_pipeline_config
from enginesmith.core.errors import TransientError
from enginesmith.core.plan import first_route
from enginesmith.core.specs import PipelineConfig
from flows.cell import build_cell, run_cell
from flows.history import last_outcomes, record_cell, versus_last_night
from pipeline.common import steps
from pipeline.common.params import RUN_CELL_FLOW, CellSummary
from pipeline.common.protocol import CellKind, Dispatch, PlannedCell
from pipeline.preflight import run_preflight
from registry.history import OutcomeStatus

# The flows a kind's dispatch may name; a run from the nightly's own process calls them as subflows.
CELL_FLOWS: dict[str, Any] = {"build-cell": build_cell, RUN_CELL_FLOW: run_cell}


def pool_of(kind: CellKind, cell: PlannedCell, routes: dict[str, str] | None = None) -> str:
    """The cell's pool: that of the first route whose pattern (a glob over the cell id, e.g. ``llama-70b/*`` for
    nodes with room for it) matches, else its kind's pool for it (its SKU, and for LLMs its artefact kind)."""
    return first_route(cell.id, routes or {}) or kind.pool(cell)


CRASH_RETRIES = 1  # a crashed cell is dispatched once more (a lost node, an OOM kill), then reported failed


class CellRunCrashed(TransientError):
    """The cell's build-cell run crashed: its process died before it reported (the worker's node was lost, the
    process was killed), so Prefect has no outcome for it."""


def retry_crashed(task: Any, task_run: Any, state: Any) -> bool:
    """Dispatch again only after a crash; a failed cell (a gate, a bad config) failed for a reason of its own."""
    try:
        state.result()
    except CellRunCrashed:
        return True
    except Exception:
        return False
    return False


@task(name="dispatch-cell", task_run_name="dispatch-{cell_id}", retries=CRASH_RETRIES,
      retry_condition_fn=retry_crashed)
def dispatch_cell(dispatch: Dispatch, cell_id: str, pool: str, timeout_s: float,
                  history: tuple[PipelineConfig, PlannedCell] | None = None) -> CellSummary:
    """Run the cell on its pool's build-cell deployment and wait; a run no worker started is cancelled, and a run
    that crashed raises ``CellRunCrashed`` so the task dispatches the cell again (a new run, which finds the cell
    in the registry if the crashed one got as far as publishing it: a cell is never published twice). With
    ``history`` (the config and the planned cell), a run that never recorded its own end (no worker started it,
    it crashed, it failed before it could) is recorded in the cell's history under that run's id."""
    from prefect.runtime import task_run

    attempt = f"attempt {max(task_run.run_count, 1)} of {CRASH_RETRIES + 1}"
    flow_run = run_deployment(f"{dispatch.flow}/{pool}", parameters=dispatch.parameters, timeout=timeout_s,
                              poll_interval=2)
    assert isinstance(flow_run, FlowRun)  # the sync API inside a sync task
    state = flow_run.state

    def record(status: OutcomeStatus, reason: str) -> None:
        # The run records how it ended itself, under its own id; the same entry written here changes nothing.
        if history is not None:
            record_cell(history[0], history[1], status, reason=reason, flow_run=str(flow_run.id))

    if state is None or state.type in (StateType.SCHEDULED, StateType.PENDING):
        from prefect import get_client

        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run.id, Cancelled(message="no worker picked it up"), force=True)
        reason = (f"no worker on pool {pool!r} started it within {timeout_s:.0f} s "
                  f"(start one: prefect worker start --pool {pool})")
        record("no-worker", reason)
        return CellSummary(cell=cell_id, status="no-worker", flow_run=str(flow_run.id), reason=reason)
    if state.type == StateType.CRASHED:
        crash = (f"cell {cell_id}: its build-cell run {flow_run.name} ({flow_run.id}) on pool {pool!r} "
                 f"crashed ({attempt}): {state.message or 'no message'}")
        record("failed", crash)
        raise CellRunCrashed(crash)
    retried = f"{attempt}: an earlier run crashed (see this task's log)" if task_run.run_count > 1 else ""
    if state.is_completed():
        result = state.result()
        summary = CellSummary.model_validate(result.model_dump() if hasattr(result, "model_dump") else result)
        return summary.model_copy(update={"flow_run": str(flow_run.id), "reason": summary.reason or retried})
    reason = f"{state.type.value}: {state.message or ''}"[:500]
    if state.is_final():  # still running when the wait ran out: the run records its own end
        record("failed", reason)
    return CellSummary(cell=cell_id, status="failed", flow_run=str(flow_run.id),
                       reason="; ".join(filter(None, [reason, retried])))


def outcome_of(cell_id: str, dispatched: PrefectFuture[CellSummary]) -> CellSummary:
    """The dispatch's summary, or a failed one naming what ended it (a crash on every attempt, an API error)."""
    outcome = dispatched.result(raise_on_failure=False)
    if isinstance(outcome, CellSummary):
        return outcome
    return CellSummary(cell=cell_id, status="failed", reason=str(outcome)[:1000])


def failed_inline(pipeline: PipelineConfig, cell: PlannedCell, state: State[Any]) -> CellSummary:
    """The summary of a run in this process that did not complete, recorded in the cell's history under the run's
    id (a run that recorded its own end wrote that entry first, and this changes nothing)."""
    reason = f"{state.type.value}: {state.message or ''}"[:500]
    run_id = state.state_details.flow_run_id
    record_cell(pipeline, cell, "failed", reason=reason, flow_run=str(run_id) if run_id else None)
    return CellSummary(cell=cell.id, status="failed", key=cell.key, reason=reason)


def run_inline(dispatch: Dispatch, cell: PlannedCell, pipeline: PipelineConfig) -> CellSummary:
    state = CELL_FLOWS[dispatch.flow](**dispatch.parameters, return_state=True)
    if state.is_completed():
        result: CellSummary = state.result()
        return result
    return failed_inline(pipeline, cell, state)


@flow(name="nightly")
def nightly(config: str = "configs/nightly.yaml", dispatch: Literal["deployments", "inline"] = "deployments",
            cell_timeout_s: float = 6 * 3600, pools: dict[str, str] | None = None) -> list[CellSummary]:
    """``pools``: routes from cell-id globs to work pools, first match wins, before the SKU × kind pool
    (``pool_of``); ``deploy_all`` creates those pools and sets them on the nightly deployment."""
    logger = get_run_logger()
    # The preflight's checks first, on the cells the registry lacks: a cell that would fail (a task that does not
    # exist, a model that cannot be reached, memory a stage lacks, a serve command vLLM refuses) is reported, not
    # sent to a GPU; a published one costs a key lookup.
    catalogue = default_catalogue()
    pipeline = load_pipeline_config(Path(config), catalogue, check_tasks=False)
    published = steps.PublishedKeys(pipeline)

    def to_build(cell: PlannedCell) -> bool:
        return cell.status != "invalid" and not published.has(cell.model.id, cell.key)

    pipeline, planned, report = run_preflight(Path(config), catalogue, config=pipeline, select=to_build)
    verdicts = {checked.id: checked for checked in report.cells}
    for line in report.skipped:
        logger.info("preflight skipped %s", line)
    summaries: list[CellSummary] = []
    todo: list[tuple[CellKind, PlannedCell]] = []
    for kind, cell in planned:
        if cell.status == "invalid":
            summaries.append(CellSummary(cell=cell.id, status="invalid", key=cell.key, reason=cell.reason))
        elif not to_build(cell):
            summaries.append(CellSummary(cell=cell.id, status="cached", key=cell.key))
        elif verdicts[cell.id].status == "blocked":
            summaries.append(CellSummary(cell=cell.id, status="blocked", key=cell.key,
                                         reason="; ".join(verdicts[cell.id].reasons)[:1000]))
        else:
            todo.append((kind, cell))
    logger.info("%d cells: %d to build, %d already published, %d invalid, %d blocked", len(planned), len(todo),
                sum(s.status == "cached" for s in summaries), sum(s.status == "invalid" for s in summaries),
                sum(s.status == "blocked" for s in summaries))
    built_tonight = {cell.id: cell for _, cell in todo}
    last_night = last_outcomes(pipeline, list(built_tonight.values()))
    dispatches = [kind.dispatch(config, cell) for kind, cell in todo]
    if dispatch == "inline":
        summaries += [run_inline(d, cell, pipeline) for d, (_, cell) in zip(dispatches, todo, strict=True)]
    elif todo:
        futures = dispatch_cell.map(dispatches, [c.id for _, c in todo], [pool_of(k, c, pools) for k, c in todo],
                                    unmapped(cell_timeout_s), [(pipeline, c) for _, c in todo])
        summaries += [outcome_of(cell.id, future) for (_, cell), future in zip(todo, futures, strict=True)]
    order = {cell.id: index for index, (_, cell) in enumerate(planned)}
    summaries.sort(key=lambda s: order.get(s.cell, len(order)))
    create_table_artifact(key="nightly-summary", description=f"nightly on {config}", table=[
        {"cell": s.cell, "status": s.status, "key": s.key[:12], "worker": s.worker, "reason": s.reason,
         "throughput ratio": s.throughput_ratio, "TPOT ratio": s.tpot_ratio,
         "vs last night": versus_last_night(pipeline, built_tonight[s.cell], s, last_night.get(s.cell))
         if s.cell in built_tonight else ""} for s in summaries])
    publish_catalogue(pipeline, changed=any(s.status in ("built", "failed", "no-worker") for s in summaries),
                      support_of=(Path(config).parent, catalogue, [cell for _, cell in planned]))
    return summaries


def publish_catalogue(pipeline: PipelineConfig, *, changed: bool,
                      support_of: tuple[Path, Catalogue, list[PlannedCell]] | None = None) -> None:
    """Regenerate the registry's static catalogue where tonight added to the registry or its history (or there is
    no catalogue yet), with the config's support matrix where ``support_of`` gives its planned cells; and link it
    from the run. A catalogue that cannot be written is logged (the night's builds are published whatever the site
    says)."""
    from prefect.artifacts import create_link_artifact

    from enginesmith.core.errors import UserError
    from registry.site import write_catalogue
    from registry.store import open_store

    url = steps.registry_url(pipeline)
    out = Path(pipeline.registry.catalogue or steps.workdir(pipeline) / "catalogue")
    if not changed and out.exists():
        return
    try:
        store = open_store(url)
        support = None
        if support_of is not None:
            from pipeline.support import config_support

            config_dir, catalogue, cells = support_of
            support = config_support(pipeline, config_dir, catalogue, store, cells=cells)
        result = write_catalogue(store, out, registry_url=url, support=support)
        index = Path(result.index).resolve()
        create_link_artifact(key="catalogue", link=index.as_uri(), link_text="the registry's catalogue",
                             description=f"catalogue of {url}")
    except Exception as exc:  # the site is a view of the registry: never the night's outcome
        get_run_logger().warning("the catalogue was not written to %s: %s", out,
                                 exc.render() if isinstance(exc, UserError) else repr(exc))
        return
    get_run_logger().info("catalogue written: %s", index)
