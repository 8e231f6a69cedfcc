"""The nightly on a fleet: each GPU run placed on one node, holding that node's GPUs through Prefect's global
concurrency limits while it runs.

A fleet file (``enginesmith.core.fleet``) names the nodes of each SKU; node ``<sku>-<i>`` is a work queue of that
name in each of its SKU's work pools (its workers poll it: ``prefect worker start --pool gpu-l40s --work-queue
l40s-1``) and a global concurrency limit ``gpus-<sku>-<i>`` with one slot per GPU. The dispatcher starts the
waiting runs in the order the cost model's simulation found best (``enginesmith.core.fleet.rank_cells``: longest
first, then searched; a changed model's cells ahead) and as ``place`` says (a reserved node for the first run that
does not fit), each as a task that takes its GPUs' slots on its node
(leased: a dispatcher that dies frees them when its lease lapses) and runs the cell's deployment on that node's
queue. A crashed run (its node died) is placed again, once, on a node whose workers still poll.
"""

from __future__ import annotations

import queue
import time
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path

from prefect import get_run_logger, task
from prefect.futures import PrefectFuture
from prefect.settings import get_current_settings
from pydantic import BaseModel

from enginesmith.core.config import Catalogue
from enginesmith.core.fleet import Fleet, Job, dispatch_order, load_fleet, place, rank_cells
from enginesmith.core.specs import PipelineConfig
from flows.dispatch import CRASH_RETRIES, CellRunCrashed, run_and_judge
from pipeline.common.params import CellSummary
from pipeline.common.protocol import CellKind, Dispatch, PlannedCell
from pipeline.fleet import FleetNight, FleetRun, plan_fleet_night
from registry.history import CellOutcome

SLOT_LIMIT_PREFIX = "gpus-"
RECHECK_S = 10.0  # how often a dispatcher waiting on runs looks again at nodes it stopped placing on
GIVE_UP_S = 600.0  # a node silent this long after its run crashed is gone: what only it could run is not run
NODE_SILENT_S = 60.0  # Prefect's own window: a work queue no worker polled for this long is not ready
PENDING_STUCK_S = 180.0  # a run Pending this long was taken by a worker whose process never started it


def slot_limit(node: str) -> str:
    return SLOT_LIMIT_PREFIX + node


def ensure_fleet(fleet: Fleet, work_pools: dict[str, set[str]]) -> None:
    """Create (or resize) each node's GPU-slot limit and its work queue in every work pool of its SKU
    (``work_pools``: SKU → pools). Idempotent: the nightly calls it at each start."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate, GlobalConcurrencyLimitUpdate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    names, gpus = fleet.node_names(), fleet.pools()
    with get_client(sync_client=True) as client:
        for sku, nodes in names.items():
            for node, slots in zip(nodes, gpus[sku], strict=True):
                try:
                    limit = client.read_global_concurrency_limit_by_name(slot_limit(node))
                    if limit.limit != slots:
                        client.update_global_concurrency_limit(slot_limit(node),
                                                               GlobalConcurrencyLimitUpdate(limit=slots))
                except ObjectNotFound:
                    client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=slot_limit(node),
                                                                                        limit=slots))
                for pool in sorted(work_pools.get(sku, ())):
                    with suppress(ObjectAlreadyExists):
                        client.create_work_queue(name=node, work_pool_name=pool,
                                                 description=f"node {node}: {slots} {sku} GPUs")


@task(name="run-on-node", task_run_name="{job_id} on {node}")
def run_on_node(dispatch: Dispatch, job_id: str, cell_id: str, work_pool: str, node: str, gpus: int,
                timeout_s: float, history: tuple[PipelineConfig, PlannedCell] | None, attempt: int,
                gpus_variable: bool = False) -> CellSummary:
    """Take ``gpus`` of the node's GPU slots, run the dispatch on the node's work queue, give the slots back. With
    ``gpus_variable`` (the pool's base job template has a ``gpus`` variable: a Kubernetes pool, flows.kubernetes)
    the run's pod requests that many GPUs."""
    from prefect.concurrency.sync import concurrency

    # A lease that cannot be renewed (the server restarted and kept its leases in memory) must not abandon a run
    # that holds real GPUs: the dispatcher's own ledger still counts them. Keep leases across restarts with
    # PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE=prefect.server.concurrency.lease_storage.filesystem
    # (docs/how-to/fleet.md).
    with concurrency(slot_limit(node), occupy=gpus, strict=True, raise_on_lease_renewal_failure=False):
        return run_and_judge(dispatch, cell_id, work_pool, timeout_s, history, attempt=attempt, work_queue=node,
                             run_name=job_id, job_variables={"gpus": gpus} if gpus_variable else None)


def slots_taken(nodes: list[str]) -> dict[str, int]:
    """Each node's GPU slots Prefect counts as taken now (its ``gpus-<node>`` limit's active slots)."""
    from prefect.client.orchestration import get_client

    wanted = {slot_limit(node): node for node in nodes}
    with get_client(sync_client=True) as client:
        return {wanted[limit.name]: int(limit.active_slots)
                for limit in client.read_global_concurrency_limits(limit=len(wanted) + 100) if limit.name in wanted}


def slots_not_ours(taken: Mapping[str, int], held: Mapping[str, int]) -> dict[str, int]:
    """Per node, the slots Prefect counts as taken beyond the GPUs this night has placed runs on (never fewer:
    a run is placed before it takes its slots and gives them back before its place is freed)."""
    return {node: count - held.get(node, 0) for node, count in taken.items() if count > held.get(node, 0)}


FOREIGN_SLOTS_WHY = ("Prefect counts {count} of its GPU slots taken that this night does not hold: another night on "
                     "this fleet, or a Prefect server that lost its concurrency leases when it restarted (it keeps "
                     "them in memory unless PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE="
                     "prefect.server.concurrency.lease_storage.filesystem); runs placed there wait for them")


def pools_with_gpus_variable(work_pools: set[str]) -> set[str]:
    """The work pools whose base job template takes a ``gpus`` job variable."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return {pool for pool in work_pools
                if "gpus" in client.read_work_pool(pool).base_job_template.get("variables", {}).get("properties", {})}


def last_polled(work_pool: str, node: str) -> float:
    """When a worker last polled ``node``'s queue in ``work_pool`` (epoch seconds; 0 for never)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        polled = client.read_work_queue_by_name(node, work_pool_name=work_pool).last_polled
    return polled.timestamp() if polled is not None else 0.0


def node_is_silent(work_pool: str, node: str) -> bool:
    """Has no worker polled ``node``'s queue in ``work_pool`` for ``NODE_SILENT_S``?"""
    return last_polled(work_pool, node) < time.time() - NODE_SILENT_S


class Stuck(BaseModel):
    cancelled: dict[str, str] = {}  # job id → why: its run never started, placed again without spending a retry
    crashed: dict[str, str] = {}  # job id → why: its run's process is gone, handled as a crash


def end_stuck_runs(job_ids: set[str], heartbeat_s: float | None) -> Stuck:
    """End the runs of ``job_ids`` that would never end by themselves, which Prefect's crash automation misses (it
    waits for a run's first heartbeat): a run Pending for ``PENDING_STUCK_S`` (its worker's process never started
    it: the node died as it did) is Cancelled, and so is one Scheduled on a node whose workers stopped polling; a
    run Running for three heartbeat intervals without a heartbeat in
    the last three (killed with its node before it sent one) is marked Crashed."""
    from datetime import datetime, timedelta, timezone

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterName,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.events.filters import EventFilter, EventNameFilter, EventOccurredFilter, EventResourceFilter
    from prefect.states import Cancelled, Crashed

    stuck = Stuck()
    now = datetime.now(timezone.utc)
    with get_client(sync_client=True) as client:
        open_runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(any_=sorted(job_ids)),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[
                StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING]))))
        for run in open_runs:
            state = run.state
            if state is None:
                continue
            waited_s = (now - state.timestamp).total_seconds()
            if (state.type == StateType.SCHEDULED and waited_s > NODE_SILENT_S and run.work_pool_name
                    and run.work_queue_name and node_is_silent(run.work_pool_name, run.work_queue_name)):
                why = f"Scheduled on {run.work_queue_name}, whose workers stopped polling: placed again"
                client.set_flow_run_state(run.id, Cancelled(message=why), force=True)
                stuck.cancelled[run.name] = why
            elif state.type == StateType.PENDING and waited_s > PENDING_STUCK_S:
                why = (f"Pending on {run.work_queue_name} for {PENDING_STUCK_S:.0f} s: its worker's process never "
                       "started it")
                client.set_flow_run_state(run.id, Cancelled(message=why), force=True)
                stuck.cancelled[run.name] = why
            elif state.type == StateType.RUNNING and heartbeat_s and run.start_time is not None:
                window = timedelta(seconds=3 * heartbeat_s)
                if now - run.start_time < window:
                    continue
                beats = client.read_events(EventFilter(
                    event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
                    resource=EventResourceFilter(id=[f"prefect.flow-run.{run.id}"]),
                    occurred=EventOccurredFilter(since=now - window, until=now)), limit=1)
                if not beats.events:
                    why = f"no heartbeat for {window.seconds} s on {run.work_queue_name}: its process is gone"
                    client.set_flow_run_state(run.id, Crashed(message=why), force=True)
                    stuck.crashed[run.name] = why
    return stuck


def dispatch_on_fleet(night: FleetNight, fleet: Fleet, *, timeout_s: float, first: Callable[[str], bool] | None,
                      history: dict[str, tuple[PipelineConfig, PlannedCell]]) -> list[CellSummary]:
    """Place and run every run of ``night``; one summary per cell (a cell whose handover run failed fails with
    that run's reason)."""
    logger = get_run_logger()
    names, capacity = fleet.node_names(), fleet.pools()
    free = {sku: list(nodes) for sku, nodes in capacity.items()}
    runs = {run.job.id: run for run in night.runs}
    waiting = dispatch_order([run.job for run in night.runs], rank_cells(night.costs, fleet, first=first))
    order = {job.id: index for index, job in enumerate(waiting)}
    running: dict[PrefectFuture[CellSummary], tuple[Job, int]] = {}
    attempts: Counter[str] = Counter()
    suspect: dict[tuple[str, int], tuple[FleetRun, float]] = {}  # a node whose run crashed, since when
    handed_over: set[str] = set()
    summaries: dict[str, CellSummary] = {}
    sized_pods = pools_with_gpus_variable({run.work_pool for run in night.runs})
    ended: queue.Queue[PrefectFuture[CellSummary]] = queue.Queue()
    abandoned: set[str] = set()  # jobs whose run was cancelled because their node went silent
    notes: dict[str, list[str]] = {}  # what was placed again, and why, per cell
    foreign: set[str] = set()  # nodes whose slots something other than this night holds (warned once each time)
    checked = liveness_checked = time.monotonic()
    while waiting or running:
        if time.monotonic() - checked > RECHECK_S:
            checked = time.monotonic()
            busy: dict[tuple[str, int, str], set[str]] = {}
            for job, node in running.values():
                if (job.pool, node) not in suspect:
                    busy.setdefault((job.pool, node, runs[job.id].work_pool), set()).add(job.id)
            for (sku, node, work_pool), job_ids in busy.items():
                if (sku, node) not in suspect and node_is_silent(work_pool, names[sku][node]):
                    logger.warning("node %s stopped polling: no run goes there until it polls again",
                                   names[sku][node])
                    suspect[(sku, node)] = (runs[next(iter(job_ids))], time.time())
            in_flight = {job.id for job, _ in running.values()}
            heartbeat_s = get_current_settings().flows.heartbeat_frequency
            stuck = Stuck()
            if in_flight and time.monotonic() - liveness_checked > (heartbeat_s or RECHECK_S):
                liveness_checked = time.monotonic()
                stuck = end_stuck_runs(in_flight, heartbeat_s)
            for job_id, why in {**stuck.cancelled, **stuck.crashed}.items():
                logger.warning("%s: %s", job_id, why)
            held = {names[sku][node]: capacity[sku][node] - gpus for sku, nodes in free.items()
                    for node, gpus in enumerate(nodes)}
            not_ours = slots_not_ours(slots_taken(list(held)), held)
            for node_name, count in not_ours.items():
                if node_name not in foreign:
                    logger.warning("node %s: %s", node_name, FOREIGN_SLOTS_WHY.format(count=count))
            foreign = set(not_ours)
            abandoned |= set(stuck.cancelled)
        for (sku, node), (run, since) in list(suspect.items()):
            if last_polled(run.work_pool, names[sku][node]) > since:
                logger.info("node %s polls again: placing runs on it", names[sku][node])
                del suspect[(sku, node)]
        for job in [job for job in waiting if job.after is not None and job.after in summaries]:
            waiting.remove(job)
            first_run = runs[str(job.after)]
            handover = summaries.pop(first_run.job.id)
            summaries[job.cell_id] = handover.model_copy(update={
                "cell": job.cell_id, "reason": f"its {first_run.job.phase} run on {first_run.work_pool} did not "
                                              f"finish: {handover.status}: {handover.reason}"[:1000]})
        may_start = [(job, job.after is None or job.after in handed_over) for job in waiting]
        usable = {sku: [0 if (sku, index) in suspect else gpus for index, gpus in enumerate(nodes)]
                  for sku, nodes in free.items()}
        for job, node in place(may_start, usable, capacity):
            free[job.pool][node] -= job.gpus
            waiting.remove(job)
            attempts[job.id] += 1
            run = runs[job.id]
            future = run_on_node.submit(run.dispatch, job.id, job.cell_id, run.work_pool, names[job.pool][node],
                                        job.gpus, timeout_s, history.get(job.cell_id) if job.phase == "cell" else None,
                                        attempts[job.id], run.work_pool in sized_pods)
            running[future] = (job, node)
            future.add_done_callback(ended.put)
        if not running:
            if suspect and min(since for _, since in suspect.values()) > time.time() - GIVE_UP_S:
                time.sleep(RECHECK_S)
                continue
            for job in waiting:  # nothing runs and nothing can start: no node of its SKU is left
                summaries.setdefault(job.cell_id, CellSummary(
                    cell=job.cell_id, status="no-worker",
                    reason=f"no {job.pool} node with {job.gpus} GPUs is left to run it: "
                           f"{', '.join(names[sku][node] for sku, node in suspect) or 'none'} stopped polling"))
            break
        try:
            finished = ended.get(timeout=RECHECK_S)
        except queue.Empty:
            continue
        job, node = running.pop(finished)
        free[job.pool][node] += job.gpus
        outcome = finished.result(raise_on_failure=False)
        where = names[job.pool][node]
        if job.id in abandoned:  # never started: the node's fault, not the cell's, so no attempt is spent
            abandoned.discard(job.id)
            attempts[job.id] -= 1
            notes.setdefault(job.cell_id, []).append(f"{job.id} placed again: node {where} stopped polling")
            waiting.append(job)
            waiting.sort(key=lambda waiting_job: order[waiting_job.id])
            continue
        if isinstance(outcome, CellRunCrashed) and attempts[job.id] <= CRASH_RETRIES:
            logger.warning("%s crashed on node %s: placing it again; no run goes to that node until its workers "
                           "poll again", job.id, where)
            notes.setdefault(job.cell_id, []).append(f"{job.id} crashed on node {where} and was placed again")
            suspect[(job.pool, node)] = (runs[job.id], time.time())
            waiting.append(job)
            waiting.sort(key=lambda waiting_job: order[waiting_job.id])
            continue
        summary = outcome if isinstance(outcome, CellSummary) else CellSummary(
            cell=job.cell_id, status="failed", reason=str(outcome)[:1000])
        if job.phase == "cell":
            summaries[job.cell_id] = summary
        elif summary.status in ("quantized", "cached", "built"):
            handed_over.add(job.id)
        else:
            summaries[job.id] = summary
    return [_noted(summaries[run.job.cell_id], notes.get(run.job.cell_id, [])) for run in night.runs
            if run.job.phase == "cell"]


def _noted(summary: CellSummary, notes: list[str]) -> CellSummary:
    if not notes:
        return summary
    return summary.model_copy(update={"reason": "; ".join(filter(None, [*notes, summary.reason]))[:1000]})


def fleet_summaries(config_path: str, pipeline: PipelineConfig, cells: list[tuple[CellKind, PlannedCell]],
                    fleet_path: Path, catalogue: Catalogue, *, pool_of: Callable[[CellKind, PlannedCell], str],
                    timeout_s: float, last_night: Mapping[str, CellOutcome]) -> list[CellSummary]:
    """The nightly's GPU cells on the fleet of ``fleet_path``: those it cannot run, blocked with why before
    anything starts; the rest placed and run, a cell whose inputs changed since its last recorded run (its key)
    ahead of the others."""
    fleet = load_fleet(fleet_path, catalogue)
    night = plan_fleet_night(config_path, pipeline, cells, fleet, pool_of)
    work_pools: dict[str, set[str]] = {}
    for run in night.runs:
        work_pools.setdefault(run.job.pool, set()).add(run.work_pool)
    ensure_fleet(fleet, work_pools)
    keys = {cell.id: cell.key for _, cell in cells}

    def changed(cell_id: str) -> bool:
        last = last_night.get(cell_id)
        return last is None or last.key != keys[cell_id]

    blocked = [CellSummary(cell=u.cell_id, status="blocked", key=keys[u.cell_id],
                           reason=f"the fleet {fleet.name} cannot run it: {u.reason}") for u in night.unschedulable]
    for summary in blocked:
        get_run_logger().warning("%s: %s", summary.cell, summary.reason)
    history = {cell.id: (pipeline, cell) for _, cell in cells}
    return blocked + dispatch_on_fleet(night, fleet, timeout_s=timeout_s, first=changed, history=history)
