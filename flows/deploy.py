"""Work pools and deployments on a Prefect server: ``nightly`` on the cpu pool with a cron schedule, and the two
cell flows once per pool (``build-cell/cpu``, ``build-cell/gpu-h100-sxm``, ``run-cell/gpu-h100-sxm``, ...): every
kind's pools (``CellKind.pools``), from this checkout; and the automation that marks a run Crashed when its
heartbeats stop.

Every worker node needs the checkout at the same absolute path (the pull step sets it as the working
directory). On Kubernetes the same deployments go on a Kubernetes work pool with a GPU node selector per
SKU (docs/how-to/kubernetes.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from uuid import UUID

from pydantic import BaseModel, SecretStr

from enginesmith.core.config import default_catalogue
from enginesmith.core.errors import UserError
from enginesmith.core.specs import TargetSpec
from flows import API_RETRY_ENV
from flows.notify import NightlyAlerts, WebhookFormat, create_nightly_alerts, deadline_window
from pipeline.common.params import RUN_CELL_FLOW
from pipeline.kind_registry import KINDS

NIGHTLY_CRON = "0 2 * * *"
# Where the flows' code is: the directory holding the ``flows`` package (a checkout, or the environment's
# site-packages). Deployments load their entrypoints from here and run with it as their working directory, so a
# worker never imports a user's ``flows/`` or ``registry/`` folder of the same name.
PACKAGES_ROOT = Path(__file__).resolve().parents[1]
# The flows a cell is dispatched to, each deployed on every pool (a route may send any cell to any pool).
CELL_ENTRYPOINTS = {"build-cell": "flows/cell.py:build_cell", RUN_CELL_FLOW: "flows/cell.py:run_cell"}
DEPLOYMENT_TAG = "enginesmith"
CRASH_AUTOMATION = "enginesmith: crash runs whose heartbeats stopped"
MISSED_HEARTBEATS = 3  # silent this many heartbeat intervals: the run's process is gone (its node, an OOM kill)


class DeployResult(BaseModel):
    pools: list[str]
    deployments: dict[str, UUID]
    crash_automation: UUID | None = None
    alerts: NightlyAlerts | None = None


def pool_names(targets: Iterable[TargetSpec], routes: Mapping[str, str] | None = None) -> list[str]:
    """The work pools ``deploy_all`` creates, each with its cell deployments, sorted: every pool a registered kind
    may need for these targets (``CellKind.pools``), ``cpu`` (the nightly's own pool) and the pools ``routes``
    name."""
    chosen = list(targets)
    return sorted(set().union(*(kind.pools(chosen) for kind in KINDS.values())) | {"cpu"}
                  | set((routes or {}).values()))


def parse_routes(items: Iterable[str]) -> dict[str, str]:
    """Routes from ``PATTERN=POOL`` items (``--route``), in the order given, which is the order ``pool_of`` tries
    them: the cell-id glob before the first ``=``, the pool after it.

    Raises:
        UserError: an item without ``=``, with an empty pattern or pool, or a pattern given twice.
    """
    routes: dict[str, str] = {}
    for item in items:
        pattern, sep, pool = (part.strip() for part in item.partition("="))
        if not sep or not pattern or not pool:
            raise UserError(f"route {item!r} is not PATTERN=POOL", where="--route",
                            hint="give a cell-id glob and a work pool, e.g. "
                                 "--route 'llama-3.1-70b-instruct/*=gpu-h200-big'")
        if pattern in routes:
            raise UserError(f"pattern {pattern!r} is routed twice (to {routes[pattern]!r} and {pool!r})",
                            where="--route", hint="give each pattern once; the first matching route wins")
        routes[pattern] = pool
    return routes


def deploy_all(*, source_dir: Path = PACKAGES_ROOT, nightly_config: str = "configs/nightly.yaml",
               cron: str = NIGHTLY_CRON, targets: list[str] | None = None,
               pools: dict[str, str] | None = None, fleet: str | None = None,
               webhook: SecretStr | None = None, webhook_format: WebhookFormat = "slack",
               deadline: str | None = None) -> DeployResult:
    """Create (or update) the work pools and deployments against the server ``PREFECT_API_URL`` names: a pool per
    SKU × kind that needs its own environment (``CellKind.pools``), plus those ``pools`` routes name (cell-id glob →
    pool, set on the nightly deployment as its ``pools`` parameter). With ``fleet`` (a fleet file), the nightly
    places its GPU cells on that fleet's nodes: each node's work queue and GPU slots are created here. With
    ``webhook`` (a secret URL), the automations of ``flows.notify`` tell it about a night that needs attention and,
    with ``deadline``, one past it."""
    from prefect import flow as prefect_flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.schedules import Cron
    from prefect.workers.process import ProcessWorker

    window = deadline_window(cron, deadline) if deadline else None  # a bad deadline is refused before any change
    if window is not None and webhook is None:
        raise UserError("a deadline needs a webhook to tell", where="--deadline", hint="add --webhook-env NAME")
    catalogue = default_catalogue()
    chosen = [catalogue.target(t) for t in targets] if targets else list(catalogue.targets.values())
    routes = dict(pools or {})
    pools_to_create = pool_names(chosen, routes)
    template = ProcessWorker.get_default_base_job_template()
    template["variables"]["properties"]["env"]["default"] = API_RETRY_ENV  # each run's, beside the worker's own
    with get_client(sync_client=True) as client:
        for pool in pools_to_create:
            client.create_work_pool(WorkPoolCreate(name=pool, type="process", base_job_template=template),
                                    overwrite=True)
    if fleet:
        from enginesmith.core.fleet import load_fleet
        from flows.fleet import ensure_fleet

        nodes = load_fleet(fleet if Path(fleet).is_absolute() else source_dir / fleet, catalogue)
        ensure_fleet(nodes, {sku: set().union(*(kind.pools([catalogue.target(sku)]) for kind in KINDS.values()))
                             for sku in nodes.pools()})
    source = str(source_dir.resolve())
    deployments: dict[str, UUID] = {}
    for flow_name, entrypoint in CELL_ENTRYPOINTS.items():
        cell_flow = prefect_flow.from_source(source=source, entrypoint=entrypoint)
        for pool in pools_to_create:
            deployments[f"{flow_name}/{pool}"] = cell_flow.deploy(  # type: ignore[union-attr,assignment]
                name=pool, work_pool_name=pool, tags=[DEPLOYMENT_TAG, pool], print_next_steps=False)
    nightly_flow = prefect_flow.from_source(source=source, entrypoint="flows/nightly.py:nightly")
    deployments["nightly/nightly"] = nightly_flow.deploy(  # type: ignore[union-attr,assignment]
        name="nightly", work_pool_name="cpu", schedule=Cron(cron, timezone="UTC"),
        parameters={"config": nightly_config, **({"pools": routes} if routes else {}),
                    **({"fleet": fleet} if fleet else {})},
        tags=[DEPLOYMENT_TAG, "nightly"], print_next_steps=False)
    alerts = None
    if webhook is not None:
        alerts = create_nightly_alerts(webhook, webhook_format, nightly_deployment=deployments["nightly/nightly"],
                                       deadline=window)
    return DeployResult(pools=pools_to_create, deployments=deployments, crash_automation=crash_silent_runs(),
                        alerts=alerts)


def crash_silent_runs(heartbeat_s: int | None = None) -> UUID | None:
    """Create (or replace) the automation that marks an enginesmith run Crashed once it has sent no heartbeat for
    ``MISSED_HEARTBEATS`` intervals. A run whose node died (the worker and the run's process with it) would
    otherwise stay Running for ever; Crashed, the nightly dispatches the cell again (``flows.nightly``).

    A run's process sends a heartbeat every ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` seconds (180 by default; the
    worker's setting wins), so ``heartbeat_s`` (default: that setting here) must be the workers' value. Returns the
    automation's id; None where heartbeats are off (nothing could tell a dead run from a live one)."""
    from datetime import timedelta

    from prefect.automations import AutomationCore, EventTrigger, Posture
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.settings import get_current_settings

    interval_s = heartbeat_s if heartbeat_s is not None else get_current_settings().flows.heartbeat_frequency
    automation = None if interval_s is None else AutomationCore(
        name=CRASH_AUTOMATION,
        description=f"A build-cell or nightly run silent for {MISSED_HEARTBEATS * interval_s} s is marked Crashed.",
        # Prefect's recipe for runs without a process: after a heartbeat, expect another (or the run's end) within
        # the window, for each run; the tag keeps it to the runs of this project's deployments.
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                    "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed", "prefect.flow-run.TimedOut"},
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={"prefect.resource.id": f"prefect.tag.{DEPLOYMENT_TAG}"},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=MISSED_HEARTBEATS * interval_s),
        ),
        actions=[ChangeFlowRunState(
            state=StateType.CRASHED,
            message=f"no heartbeat for {MISSED_HEARTBEATS * interval_s} s: the run's process is gone (its worker's "
                    "node died or the process was killed)")],
    )
    with get_client(sync_client=True) as client:
        for existing in client.read_automations_by_name(CRASH_AUTOMATION):
            client.delete_automation(existing.id)
        return client.create_automation(automation) if automation is not None else None
