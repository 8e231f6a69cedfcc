"""Running a build tool or a server as a process: its output streamed to a log file (and the console), a timeout, the
whole process group stopped on timeout or Ctrl-C, and the process told to stop when the one that started it dies."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


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
    ``setpriv --pdeathsig`` (the flag survives its exec); ``argv`` unchanged where there is no setpriv."""
    setpriv = shutil.which("setpriv") if sys.platform == "linux" else None
    return [setpriv, "--pdeathsig", "TERM", "--", *argv] if setpriv else list(argv)


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
        process = subprocess.Popen(
            dies_with_parent(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
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
