"""What the flows write to each cell's history (``registry.history``), and what the nightly reads back from it.

A build-cell run records how it ended (built, gate-failed, failed) under its own flow run id, so a second writer
of the same run records nothing; the nightly records, under the same id, the runs that could not record their end
(no worker started them, they crashed, they failed before they could): where the run did record, that write
changes nothing. A registry that stops answering is asked again (``HISTORY_RETRY_DELAYS_S``: a minute and a
half in all, past a storage outage's usual length; a second write of the same run changes nothing); after that,
recording is best effort: the manifest is the record of what was published, and a write that still fails is
logged, not turned into a failed build.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from enginesmith.core.errors import TransientError, UserError
from enginesmith.core.specs import PipelineConfig
from pipeline.common import steps
from pipeline.common.params import CellSummary
from pipeline.common.protocol import PlannedCell
from registry.history import (
    HIGHER_IS_BETTER,
    CellOutcome,
    OutcomeStatus,
    find_regressions,
    outcome_from_report,
    previous_outcome,
    signed_percent,
)

log = logging.getLogger(__name__)
HISTORY_RETRY_DELAYS_S: list[float] = [10, 30, 60]


def this_flow_run() -> str:
    from prefect.runtime import flow_run

    return str(flow_run.id or "")


def record_cell(config: PipelineConfig, cell: PlannedCell, status: OutcomeStatus, *,
                report: dict[str, Any] | None = None, artefact_dir: Path | None = None, reason: str = "",
                flow_run: str | None = None, signer: str | None = None) -> CellOutcome | None:
    """Record how a run of ``cell`` ended; the outcome, or None where the registry could not take it."""
    from enginesmith.core.artefacts import read_artefact
    from registry.history import record_outcome
    from registry.store import open_store

    outcome = outcome_from_report(
        model=cell.model.id, cell=cell.id, recipe=cell.recipe.id, target=cell.target.id, kind=cell.kind,
        key=cell.key, status=status, report=report,
        artefact=read_artefact(artefact_dir) if artefact_dir is not None else None,
        flow_run=this_flow_run() if flow_run is None else flow_run, reason=reason[:1000], signer=signer)
    store = open_store(steps.registry_url(config))
    for delay_s in [*HISTORY_RETRY_DELAYS_S, None]:
        try:
            record_outcome(store, outcome)
            return outcome
        except UserError as exc:  # a transient error is asked again, then given up on as any other
            if not isinstance(exc, TransientError) or delay_s is None:
                log.warning("could not record cell %s's outcome in the registry's history: %s", cell.id, exc.render())
                return None
            log.info("recording cell %s's outcome: %s; asking again in %g s", cell.id, exc.message, delay_s)
            time.sleep(delay_s)
    return None


def last_outcomes(config: PipelineConfig, cells: list[PlannedCell]) -> dict[str, CellOutcome]:
    """The newest recorded outcome with measurements of each cell (before tonight's runs record theirs)."""
    from registry.store import open_store

    store = open_store(steps.registry_url(config))
    found = {}
    for cell in cells:
        try:
            outcome = previous_outcome(store, cell.model.id, cell.id)
        except UserError as exc:
            log.warning("could not read cell %s's history: %s", cell.id, exc.render())
            continue
        if outcome is not None:
            found[cell.id] = outcome
    return found


def versus_last_night(config: PipelineConfig, cell: PlannedCell, summary: CellSummary,
                      before: CellOutcome | None) -> str:
    """The nightly summary's "vs last night" cell: each metric tonight against the cell's previous measurement,
    marked a regression (``find_regressions``), better, or within the two measurements' spreads."""
    if summary.status not in ("built", "failed"):
        return ""
    if before is None:
        return "first build" if summary.status == "built" else ""
    from registry.store import open_store

    try:
        tonight = previous_outcome(open_store(steps.registry_url(config)), cell.model.id, cell.id)
    except UserError as exc:
        log.warning("could not read cell %s's history: %s", cell.id, exc.render())
        return ""
    if tonight is None or tonight.recorded == before.recorded:
        return "nothing measured tonight"
    regressed = {r.metric: r for r in find_regressions(before, tonight, "previous", before.key)}
    changes = []
    for metric, after in tonight.metrics.items():
        previous = before.metrics.get(metric)
        if previous is None or previous.median == 0:
            continue
        change = after.median / previous.median - 1
        improved = (change > 0) == HIGHER_IS_BETTER.get(metric, True) and \
            abs(after.median - previous.median) > previous.half_range + after.half_range
        verdict = "regression" if metric in regressed else "better" if improved else "within spread"
        changes.append(f"{metric} {signed_percent(change)} ({verdict})")
    changes += [f"{r.metric} {signed_percent(r.change)} (regression)" for r in regressed.values()
                if r.metric not in tonight.metrics]
    return "; ".join(changes) or "no comparable measurement"
