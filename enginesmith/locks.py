"""One writer per stage output: a lock file beside the output directory, held while the output is produced.

Two processes asked for the same output (two nightly runs, a retry next to a still-running attempt) would
otherwise share one ``<out>.partial`` staging directory. The second waits, then finds the output finished.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)


@contextmanager
def output_lock(out_dir: Path, stage: str) -> Iterator[None]:
    from filelock import FileLock, Timeout

    lock_path = out_dir.with_name(out_dir.name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.warning("another process is producing %s (%s); waiting for it to finish", out_dir, stage)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
