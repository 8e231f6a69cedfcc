"""A real OCI registry for the registry tests: Debian's ``docker-registry`` (the CNCF distribution server, 2.8) on
loopback, started with a config of our own: storage in a temporary directory, deletes enabled, htpasswd (bcrypt)
auth. tests/conftest.py loads this module as a plugin: ``oci_registry`` is one server for the whole session.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

USERNAME = "ci-user"
PASSWORD = "ci-oci-password-0123456789"
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10

requires_docker_registry = pytest.mark.skipif(
    shutil.which("docker-registry") is None,
    reason="needs Debian's docker-registry (apt-get install docker-registry; scripts/setup-oci-registry.sh)",
)


class OciRegistry:
    """One ``docker-registry serve`` process on 127.0.0.1 with its own storage and htpasswd file."""

    def __init__(self, work_dir: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.work_dir = work_dir
        self.log_path = work_dir / "registry.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def registry_url(self, namespace: str) -> str:
        return f"oci+http://{self.host}/{namespace}"

    @property
    def env(self) -> dict[str, str]:
        return {"ENGINESMITH_OCI_USERNAME": USERNAME, "ENGINESMITH_OCI_PASSWORD": PASSWORD,
                "DOCKER_CONFIG": str(self.work_dir / "no-docker-config")}

    def start(self) -> None:
        import bcrypt

        self.work_dir.mkdir(parents=True, exist_ok=True)
        htpasswd = self.work_dir / "htpasswd"
        htpasswd.write_text(f"{USERNAME}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=5)).decode()}\n")
        config = self.work_dir / "config.yml"
        config.write_text(
            "version: 0.1\nlog: {level: warn}\n"
            f"storage:\n  filesystem: {{rootdirectory: {self.work_dir / 'data'}}}\n  delete: {{enabled: true}}\n"
            f"http:\n  addr: {self.host}\n  secret: enginesmith-tests\n"
            f"auth:\n  htpasswd: {{realm: enginesmith-tests, path: {htpasswd}}}\n"
        )
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log,
                                             stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"docker-registry exited ({self._process.returncode}):\n{self.log_path.read_text()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://{self.host}/v2/", timeout=2).status_code == 401:  # up, and asking for auth
                    return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"docker-registry did not answer within {START_TIMEOUT_S} s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None


@contextlib.contextmanager
def running_oci_registry(work_dir: Path) -> Iterator[OciRegistry]:
    server = OciRegistry(work_dir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session", name="oci_registry")
def oci_registry_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OciRegistry]:
    """One docker-registry for the test session; tests use a namespace of their own on it."""
    if shutil.which("docker-registry") is None:
        pytest.skip("needs Debian's docker-registry (apt-get install docker-registry; scripts/setup-oci-registry.sh)")
    with running_oci_registry(tmp_path_factory.mktemp("oci-registry")) as server:
        yield server
