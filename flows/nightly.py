"""The ``nightly`` flow: plan the matrix, skip cells already in the registry, dispatch the rest to the
``build-cell`` deployment on each cell's work pool (or run them here, ``dispatch="inline"``), and summarise
every cell. One failing cell never stops the others; a cell no worker picks up times out with a reason; a cell
whose run crashed (its worker's node died: the server marks a run Crashed when its heartbeats stop, see
``flows.deploy``) is dispatched once more, then reported failed. With a fleet file, GPU cells are placed on its
nodes instead, each holding its GPUs (``flows.fleet``). A night with a cell that needs attention emits one event
for the morning's webhook (``flows.notify``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from prefect import flow, get_run_logger, unmapped
from prefect.artifacts import create_table_artifact
from prefect.states import State

import enginesmith.entry  # noqa: F401  (first: our components, never a same-named folder where Prefect runs)
from enginesmith.core.config import Catalogue, default_catalogue, load_pipeline_config
from enginesmith.core.plan import first_route
from enginesmith.core.specs import PipelineConfig
from flows.cell import build_cell, run_cell
from flows.dispatch import dispatch_cell, outcome_of
from flows.history import last_outcomes, record_cell, versus_last_night
from flows.notify import ATTENTION_EVENT, emit_attention
from pipeline.common import steps
from pipeline.common.params import RUN_CELL_FLOW, CellSummary
from pipeline.common.protocol import CellKind, Dispatch, PlannedCell
from pipeline.preflight import run_preflight

# The flows a kind's dispatch may name; a run from the nightly's own process calls them as subflows.
CELL_FLOWS: dict[str, Any] = {"build-cell": build_cell, RUN_CELL_FLOW: run_cell}


def pool_of(kind: CellKind, cell: PlannedCell, routes: dict[str, str] | None = None) -> str:
    """The cell's pool: that of the first route whose pattern (a glob over the cell id, e.g. ``llama-70b/*`` for
    nodes with room for it) matches, else its kind's pool for it (its SKU, and for LLMs its artefact kind)."""
    return first_route(cell.id, routes or {}) or kind.pool(cell)


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
            cell_timeout_s: float = 6 * 3600, pools: dict[str, str] | None = None,
            fleet: str | None = None) -> list[CellSummary]:
    """``pools``: routes from cell-id globs to work pools, first match wins, before the SKU × kind pool
    (``pool_of``); ``deploy_all`` creates those pools and sets them on the nightly deployment. ``fleet``: a fleet
    file (nodes per SKU); its GPU cells are placed on its nodes, each holding its GPUs there (``flows.fleet``),
    instead of going to any worker of their pool."""
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
        on_fleet = [(kind, cell) for kind, cell in todo if fleet is not None and not cell.target.is_cpu]
        fleet_ids = {cell.id for _, cell in on_fleet}
        to_pools = [(d, (kind, cell)) for d, (kind, cell) in zip(dispatches, todo, strict=True)
                    if cell.id not in fleet_ids]
        futures = dispatch_cell.map([d for d, _ in to_pools], [c.id for _, (_, c) in to_pools],
                                    [pool_of(k, c, pools) for _, (k, c) in to_pools], unmapped(cell_timeout_s),
                                    [(pipeline, c) for _, (_, c) in to_pools]) if to_pools else []
        if on_fleet and fleet is not None:
            from flows.fleet import fleet_summaries

            summaries += fleet_summaries(config, pipeline, on_fleet, Path(fleet), catalogue,
                                         pool_of=lambda kind, cell: pool_of(kind, cell, pools),
                                         timeout_s=cell_timeout_s, last_night=last_night)
        summaries += [outcome_of(cell.id, future) for (_, (_, cell)), future in zip(to_pools, futures, strict=True)]
    for renewed in steps.renew_latest_statements(pipeline, [cell.model.id for _, cell in planned
                                                             if cell.status != "invalid"]):
        logger.info("renewed the signed statement of %s", renewed)
    order = {cell.id: index for index, (_, cell) in enumerate(planned)}
    summaries.sort(key=lambda s: order.get(s.cell, len(order)))
    versus = {s.cell: versus_last_night(pipeline, built_tonight[s.cell], s, last_night.get(s.cell))
              for s in summaries if s.cell in built_tonight}
    create_table_artifact(key="nightly-summary", description=f"nightly on {config}", table=[
        {"cell": s.cell, "status": s.status, "key": s.key[:12], "worker": s.worker, "reason": s.reason,
         "throughput ratio": s.throughput_ratio, "TPOT ratio": s.tpot_ratio, "vs last night": versus.get(s.cell, "")}
        for s in summaries])
    catalogue_link = publish_catalogue(
        pipeline, changed=any(s.status in ("built", "failed", "no-worker") for s in summaries),
        support_of=(Path(config).parent, catalogue, [cell for _, cell in planned]))
    from prefect.runtime import flow_run

    if emit_attention(str(flow_run.id), config, summaries, versus, catalogue_link):
        logger.info("some cells need attention: the night's summary went out as %s", ATTENTION_EVENT)
    return summaries


def publish_catalogue(pipeline: PipelineConfig, *, changed: bool,
                      support_of: tuple[Path, Catalogue, list[PlannedCell]] | None = None) -> str | None:
    """Regenerate the registry's static catalogue where tonight added to the registry or its history (or there is
    no catalogue yet), with the config's support matrix where ``support_of`` gives its planned cells; and link it
    from the run. A catalogue that cannot be written is logged (the night's builds are published whatever the site
    says). Returns the link to its index, None where there is none."""
    from prefect.artifacts import create_link_artifact

    from enginesmith.core.errors import UserError
    from registry.site import write_catalogue
    from registry.store import open_store

    url = steps.registry_url(pipeline)
    out = Path(pipeline.registry.catalogue or steps.workdir(pipeline) / "catalogue")
    if not changed and out.exists():
        return (out / "index.html").resolve().as_uri() if (out / "index.html").is_file() else None
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
        return None
    get_run_logger().info("catalogue written: %s", index)
    return index.as_uri()
