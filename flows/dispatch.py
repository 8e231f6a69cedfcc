"""Sending one run to a pool (or one node's work queue) and judging how it ended: what the nightly's dispatch
tasks share, whether they dispatch a cell to any worker of its pool (``dispatch_cell``) or the fleet dispatcher
places it on one node (``flows.fleet``)."""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.deployments import run_deployment
from prefect.futures import PrefectFuture
from prefect.states import Cancelled

from enginesmith.core.errors import TransientError
from enginesmith.core.specs import PipelineConfig
from flows.history import record_cell
from pipeline.common.params import CellSummary
from pipeline.common.protocol import Dispatch, PlannedCell
from registry.history import OutcomeStatus

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
    """Run the cell on its pool's build-cell deployment and wait (``run_and_judge``); a crashed run raises
    ``CellRunCrashed`` and this task dispatches the cell again."""
    from prefect.runtime import task_run

    return run_and_judge(dispatch, cell_id, pool, timeout_s, history, attempt=max(task_run.run_count, 1))


def run_and_judge(dispatch: Dispatch, cell_id: str, pool: str, timeout_s: float,
                  history: tuple[PipelineConfig, PlannedCell] | None, *, attempt: int,
                  work_queue: str | None = None, run_name: str | None = None,
                  job_variables: dict[str, Any] | None = None) -> CellSummary:
    """Run ``dispatch`` on ``pool``'s deployment of its flow (on one node's ``work_queue`` where given) and wait;
    a run no worker started is cancelled, and a run that crashed raises ``CellRunCrashed`` (a dispatch again is a
    new run, which finds the cell in the registry if the crashed one got as far as publishing it: a cell is never
    published twice). With ``history`` (the config and the planned cell), a run that never recorded its own end (no
    worker started it, it crashed, it failed before it could) is recorded in the cell's history under that run's
    id. The run is named ``run_name`` (default: the cell id), so the UI and the server's records say which cell it
    builds."""
    attempts = f"attempt {attempt} of {CRASH_RETRIES + 1}"
    flow_run = run_deployment(f"{dispatch.flow}/{pool}", parameters=dispatch.parameters, timeout=timeout_s,
                              poll_interval=2, work_queue_name=work_queue, flow_run_name=run_name or cell_id,
                              job_variables=job_variables)
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
        queue = f" --work-queue {work_queue}" if work_queue else ""
        where = f"node {work_queue!r} of pool {pool!r}" if work_queue else f"pool {pool!r}"
        reason = (f"no worker on {where} started it within {timeout_s:.0f} s "
                  f"(start one: prefect worker start --pool {pool}{queue})")
        record("no-worker", reason)
        return CellSummary(cell=cell_id, status="no-worker", flow_run=str(flow_run.id), reason=reason)
    if state.type == StateType.CRASHED:
        crash = (f"cell {cell_id}: its {dispatch.flow} run {flow_run.name} ({flow_run.id}) on pool {pool!r} "
                 f"crashed ({attempts}): {state.message or 'no message'}")
        record("failed", crash)
        raise CellRunCrashed(crash)
    retried = f"{attempts}: an earlier run crashed (see this task's log)" if attempt > 1 else ""
    if state.is_completed():
        result = state.result()
        summary = CellSummary.model_validate(result.model_dump() if hasattr(result, "model_dump") else result)
        return summary.model_copy(update={"flow_run": str(flow_run.id),
                                          "reason": "; ".join(filter(None, [summary.reason, retried]))})
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
