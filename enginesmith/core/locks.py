"""Advisory file locks (flock) shared by the registry and the stages: one writer at a time per path.

``output_lock`` guards a stage output: two processes asked for the same output (two nightly runs, a retry next
to a still-running attempt) would otherwise share one ``<out>.partial`` staging directory. The second waits,
then finds the output finished.
"""

from __future__ import annotations

import errno
import fcntl
import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

log = logging.getLogger(__name__)
_LOCKS_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


@contextmanager
def exclusive(lock_path: Path, *, waiting_message: str | None = None, best_effort: bool = False) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (created with its folder); log ``waiting_message`` if it is held.

    ``best_effort``: on a filesystem that refuses locks (some NFS mounts answer ``ENOLCK``), go on without one, for
    callers that stay correct unlocked and lock only to avoid duplicate work.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting_message:
                log.warning("%s", waiting_message)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        except OSError as exc:
            if not best_effort or exc.errno not in _LOCKS_UNSUPPORTED:
                raise
            log.warning("%s cannot be locked (%s); going on without the lock", lock_path, exc.strerror)
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def output_lock(out_dir: Path, stage: str) -> AbstractContextManager[None]:
    return exclusive(out_dir.with_name(out_dir.name + ".lock"),
                     waiting_message=f"another process is producing {out_dir} ({stage}); waiting for it to finish")
