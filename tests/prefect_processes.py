"""A Prefect server and process workers as real processes, as a deployment runs them: ``prefect server start`` on a
database URL (PostgreSQL, tests/postgres.py; tests/conftest.py starts one server for the session), and ``prefect
worker start --pool P`` per pool, each in its own session so a test can kill a worker's whole node (the worker and
every process of the runs it started)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import REPO_ROOT
from tests.waiting import wait_for, wait_for_health

SERVER_START_TIMEOUT_S = 600  # a fresh database migrates first; safety net only
WORKER_START_TIMEOUT_S = 300
STOP_GRACE_S = 10


@dataclass
class ServerProcess:
    """``prefect server start`` at ``127.0.0.1:port`` on ``database_url`` (None: SQLite in its home), with the UI or
    without, in a home of its own that outlives a restart (a server's file-based state, e.g. its concurrency leases
    with ``PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE=...filesystem``, is found again)."""

    database_url: str | None
    port: int
    log_path: Path
    ui: bool = False
    env: dict[str, str] = field(default_factory=dict)
    home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="prefect-server-home-")))
    process: subprocess.Popen[bytes] | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self) -> str:
        """Start it and return its API URL once healthy (the log is appended to across restarts)."""
        env = {**os.environ, "PREFECT_HOME": str(self.home), "PREFECT_SERVER_API_HOST": "127.0.0.1",
               "PREFECT_SERVER_API_PORT": str(self.port), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
               "PREFECT_UI_API_URL": self.api_url, **self.env}
        if self.database_url is not None:
            env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = self.database_url
        env.pop("PREFECT_API_URL", None)
        with self.log_path.open("a") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(self.port),
                 *([] if self.ui else ["--no-ui"])], cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        wait_for_health(f"{self.api_url}/health", "the Prefect server to answer /api/health",
                        timeout_s=SERVER_START_TIMEOUT_S, process=self.process, log=self.log_path)
        return self.api_url

    def stop(self) -> None:
        if self.process is not None:
            stop_session(self.process)
            self.process = None


@contextmanager
def running_prefect_server(database_url: str | None, *, port: int, log_path: Path, ui: bool = False,
                           env: dict[str, str] | None = None) -> Iterator[str]:
    """A ``ServerProcess`` for the block's duration; yields its API URL once healthy."""
    server = ServerProcess(database_url, port, log_path, ui=ui, env=env or {})
    try:
        yield server.start()
    finally:
        server.stop()


@dataclass
class Worker:
    name: str
    pool: str
    process: subprocess.Popen[bytes]
    log_path: Path


@dataclass
class Workers:
    """Process workers against one server; every worker this started is stopped by ``stop_all``, with the runs
    its node still has."""

    api_url: str
    log_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    started: list[Worker] = field(default_factory=list)

    def start(self, pool: str, name: str, env: dict[str, str] | None = None, *, queue: str | None = None,
              wait: bool = True) -> Worker:
        """``prefect worker start --pool pool --name name`` (polling only the work queue ``queue`` where given),
        with the node's own ``env`` on top of the shared one; returns once the server lists it online (``wait``;
        else at once: ``wait_online``)."""
        log_path = self.log_dir / f"worker-{name}.log"
        # A test's worker polls its pool every second (Prefect's default is 10 s): a run waits for an event, not a poll.
        env = {**os.environ, "PREFECT_WORKER_QUERY_SECONDS": "1", **self.env, **(env or {}),
               "PREFECT_API_URL": self.api_url}
        with log_path.open("w") as log:
            process = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", pool,
                                        "--type", "process", "--name", name,
                                        *(["--work-queue", queue] if queue else [])], cwd=REPO_ROOT, env=env,
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        worker = Worker(name=name, pool=pool, process=process, log_path=log_path)
        self.started.append(worker)
        if wait:
            self.wait_online(worker)
        return worker

    def wait_online(self, worker: Worker) -> None:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import WorkerFilter, WorkerFilterStatus

        def online() -> bool:
            with get_client(sync_client=True) as client:
                listed = client.read_workers_for_work_pool(
                    worker.pool, worker_filter=WorkerFilter(status=WorkerFilterStatus(any_=["ONLINE"])))
            return any(w.name == worker.name for w in listed)

        wait_for(online, f"worker {worker.name} on pool {worker.pool} to be online", timeout_s=WORKER_START_TIMEOUT_S,
                 process=worker.process, log=worker.log_path, interval_s=0.5)

    def stop_all(self) -> None:
        for worker in self.started:
            stop_node(worker)


def stop_session(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process's session (its group), then SIGKILL whatever is left after a grace period."""
    if process.poll() is None:
        _signal_group(process.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=STOP_GRACE_S)
    _signal_group(process.pid, signal.SIGKILL)
    process.wait()


def stop_node(worker: Worker) -> None:
    """Stop the worker (it ignores the first SIGINT; the second makes it exit) and every process of the runs it
    started, which live in process groups of their own and would outlive it."""
    if worker.process.poll() is None:
        for _ in range(2):
            _signal_group(worker.process.pid, signal.SIGINT)
            try:
                worker.process.wait(timeout=STOP_GRACE_S)
                break
            except subprocess.TimeoutExpired:
                continue
    _signal_group(worker.process.pid, signal.SIGKILL)
    worker.process.wait()
    for pid in processes_with_env("PREFECT__WORKER_NAME", worker.name):
        _kill(pid, signal.SIGKILL)


def processes_with_env(name: str, value: str) -> list[int]:
    """Every process (other than this one) whose environment has ``name=value``: the processes of one flow run
    (``PREFECT__FLOW_RUN_ID``) or of one worker's runs (``PREFECT__WORKER_NAME``), servers they started included."""
    wanted = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or not ours to read
            continue
        if wanted in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _signal_group(pgid: int, signum: int) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def _kill(pid: int, signum: int) -> None:
    with suppress(ProcessLookupError):
        os.kill(pid, signum)
