"""Waiting in tests for an observed event, never for a hoped-for moment.

``wait_for`` polls a condition; its timeout is only a safety net (generous, and it fails naming what never
happened). ``pause_when`` and ``kill_when`` act on a child process at a moment the test has seen: they stop the
process (SIGSTOP, then wait until every thread is stopped), check the condition again on the frozen state, and
only then go on, so a slow machine can delay the moment but never move it past what was observed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

POLL_S = 0.02
LOG_TAIL_CHARS = 3000


def wait_for(condition: Callable[[], bool], what: str, *, timeout_s: float, process: subprocess.Popen | None = None,
             log: Path | None = None, interval_s: float = POLL_S) -> None:
    """Return once ``condition()`` holds (asked every ``interval_s``); fail naming ``what`` if ``process`` exits
    first or ``timeout_s`` passes."""
    _wait(condition, what, time.monotonic() + timeout_s, timeout_s, process, log, interval_s)



def wait_for_health(url: str, what: str, *, timeout_s: float, process: subprocess.Popen | None = None,
                    log: Path | None = None) -> None:
    """Return once ``url`` answers 200 (a server's /health), asked every second."""
    import httpx

    def healthy() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(healthy, what, timeout_s=timeout_s, process=process, log=log, interval_s=1)

def _wait(condition: Callable[[], bool], what: str, deadline: float, timeout_s: float,
          process: subprocess.Popen | None, log: Path | None, interval_s: float = POLL_S) -> None:
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"waiting for {what}: the process exited with {process.returncode} first"
                                 f"{_tail(log)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"waiting for {what}: not seen within {timeout_s:g} s (a safety net; the "
                                 f"machine is very slow or the event never happens){_tail(log)}")
        time.sleep(interval_s)


def pause(process: subprocess.Popen, *, timeout_s: float = 30) -> None:
    """SIGSTOP ``process`` and return once every one of its threads has stopped (Linux ``/proc``)."""
    os.kill(process.pid, signal.SIGSTOP)
    wait_for(lambda: _all_threads_stopped(process.pid), f"process {process.pid} to stop", timeout_s=timeout_s,
             process=process)


def resume(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGCONT)


def pause_when(process: subprocess.Popen, condition: Callable[[], bool], what: str, *, timeout_s: float,
               log: Path | None = None) -> None:
    """Return with ``process`` stopped at a moment where ``condition()`` holds (checked while it is stopped)."""
    deadline = time.monotonic() + timeout_s
    while True:
        _wait(condition, what, deadline, timeout_s, process, log)
        pause(process)
        if condition():
            return
        resume(process)  # it moved on between the look and the stop: look again


def kill_when(process: subprocess.Popen, condition: Callable[[], bool], what: str, *, timeout_s: float,
              log: Path | None = None) -> None:
    """SIGKILL ``process`` (no cleanup runs, as after a crash) at a moment where ``condition()`` holds."""
    try:
        pause_when(process, condition, what, timeout_s=timeout_s, log=log)
    finally:
        process.kill()  # also when waiting failed: never leave the child running (or stopped) behind
        process.wait()


def _all_threads_stopped(pid: int) -> bool:
    """Every thread stopped (or already gone), and the process itself has not ended."""
    states = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return False
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # a thread that just ended
            continue
        states.append(stat.rsplit(")", 1)[1].split()[0])
    return "T" in states and all(state in ("T", "Z", "X") for state in states)


def _tail(log: Path | None) -> str:
    if log is None:
        return ""
    try:
        return f"\n--- {log} ---\n{log.read_text(errors='replace')[-LOG_TAIL_CHARS:]}"
    except FileNotFoundError:
        return f"\n({log} was not written)"
