"""A PostgreSQL cluster of the test's own: ``initdb`` in a temporary directory, the server on 127.0.0.1 and a
free port (its unix socket in the same directory, so it never meets a system cluster), removed at the end.

``initdb`` refuses to run as root; as root the cluster belongs to the ``postgres`` user Debian's package creates
(``nobody`` where there is none). ``scripts/setup-postgres.sh`` installs the package on a bare machine.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

DATABASE = "prefect"
SUPERUSER = "prefect"
START_TIMEOUT_S = 300  # pg_ctl's own wait for "ready" (a safety net; it returns as soon as the server is up)


def postgres_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/<major>/bin`` that has initdb (Debian's layout), else initdb's PATH dir."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    if candidates:
        return candidates[-1].parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def needs_postgres() -> Path:
    bin_dir = postgres_bin()
    if bin_dir is None:
        pytest.skip("no PostgreSQL (./scripts/setup-postgres.sh installs Debian's postgresql)")
    return bin_dir


def _cluster_owner() -> pwd.struct_passwd | None:
    """The unprivileged user that owns the cluster when we are root; None when we are not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root and there is neither a 'postgres' nor a 'nobody' user to own the cluster")


class PostgresCluster:
    """A cluster initialised in its own directory on ``127.0.0.1:port``; stoppable and startable again on the same
    data (``stop(immediate=True)`` is a crash: the next start recovers from the WAL)."""

    def __init__(self, port: int) -> None:
        self.bin_dir = needs_postgres()
        self.port = port
        self.owner = _cluster_owner()
        # The owner must be able to reach the directory: a mkdtemp under pytest's root-only tmp dirs would not do.
        self.root = Path(tempfile.mkdtemp(prefix="enginesmith-pg-"))
        self.root.chmod(0o700)
        self.data, self.socket_dir, self.log = self.root / "data", self.root / "socket", self.root / "server.log"
        self.socket_dir.mkdir()
        password = secrets.token_hex(16)
        password_file = self.root / "password"
        password_file.write_text(password + "\n")
        self.as_owner: dict[str, object] = {}
        if self.owner is not None:
            for path in (self.root, self.socket_dir, password_file):
                os.chown(path, self.owner.pw_uid, self.owner.pw_gid)
            self.as_owner = {"user": self.owner.pw_uid, "group": self.owner.pw_gid, "extra_groups": []}
        self.url = f"postgresql+asyncpg://{SUPERUSER}:{password}@127.0.0.1:{port}/{DATABASE}"
        self._run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "--pwfile", str(password_file),
                  "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync")

    def _run(self, *argv: str) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, cwd=self.root, timeout=START_TIMEOUT_S,
                              env={**os.environ, "LC_ALL": "C.UTF-8"}, **self.as_owner)  # type: ignore[call-overload]
        if done.returncode != 0:
            tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}{tail}")

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.socket_dir} -c fsync=off "
                   "-c max_connections=200")
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "-t",
                  str(START_TIMEOUT_S), "start")

    def create_database(self) -> None:
        self._run(str(self.bin_dir / "createdb"), "-h", str(self.socket_dir), "-p", str(self.port), "-U", SUPERUSER,
                  DATABASE)

    def stop(self, *, immediate: bool = True) -> None:
        """``immediate``: every backend killed at once, no checkpoint (a crash, as far as the clients can tell)."""
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate" if immediate else "fast",
                  "-w", "stop")

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


@contextmanager
def postgres_cluster(port: int) -> Iterator[PostgresCluster]:
    """A fresh cluster listening on ``127.0.0.1:port`` with a database ``prefect``, stopped and removed at the end;
    its ``url`` is the SQLAlchemy URL for asyncpg (password authentication over TCP, as a real deployment has)."""
    cluster = PostgresCluster(port)
    try:
        cluster.start()
        try:
            cluster.create_database()
            yield cluster
        finally:
            cluster.stop()
    finally:
        cluster.remove()


@contextmanager
def running_postgres(port: int) -> Iterator[str]:
    """``postgres_cluster``'s URL, for a caller that never restarts it."""
    with postgres_cluster(port) as cluster:
        yield cluster.url
