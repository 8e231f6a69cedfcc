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


@contextmanager
def running_postgres(port: int) -> Iterator[str]:
    """A fresh cluster listening on ``127.0.0.1:port`` with a database ``prefect``; yields its SQLAlchemy URL for
    asyncpg (password authentication over TCP, as a real deployment has)."""
    bin_dir = needs_postgres()
    owner = _cluster_owner()
    # The owner must be able to reach the directory: a mkdtemp under pytest's root-only tmp dirs would not do.
    root = Path(tempfile.mkdtemp(prefix="enginesmith-pg-"))
    root.chmod(0o700)
    data, socket_dir, log = root / "data", root / "socket", root / "server.log"
    socket_dir.mkdir()
    password = secrets.token_hex(16)
    password_file = root / "password"
    password_file.write_text(password + "\n")
    as_owner: dict[str, object] = {}
    if owner is not None:
        for path in (root, socket_dir, password_file):
            os.chown(path, owner.pw_uid, owner.pw_gid)
        as_owner = {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}

    def run(*argv: str) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, cwd=root, timeout=START_TIMEOUT_S,
                              env={**os.environ, "LC_ALL": "C.UTF-8"}, **as_owner)  # type: ignore[call-overload]
        if done.returncode != 0:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}{tail}")

    try:
        run(str(bin_dir / "initdb"), "-D", str(data), "-U", SUPERUSER, "--pwfile", str(password_file),
            "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync")
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {socket_dir} -c fsync=off -c max_connections=200"
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t",
            str(START_TIMEOUT_S), "start")
        try:
            run(str(bin_dir / "createdb"), "-h", str(socket_dir), "-p", str(port), "-U", SUPERUSER, DATABASE)
            yield f"postgresql+asyncpg://{SUPERUSER}:{password}@127.0.0.1:{port}/{DATABASE}"
        finally:
            run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)
