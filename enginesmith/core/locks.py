"""Advisory file locks (flock) shared by the registry and the stages: one writer at a time per path.

``output_lock`` guards a stage output: two processes asked for the same output (two nightly runs, a retry next
to a still-running attempt) would otherwise share one ``<out>.partial`` staging directory. The second waits,
then finds the output finished.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

log = logging.getLogger(__name__)
_LOCKS_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


@contextmanager
def exclusive(lock_path: Path, *, waiting_message: str | None = None, best_effort: bool = False,
              remove: bool = False) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` (created with its folder); log ``waiting_message`` if it is held.

    ``best_effort``: on a filesystem that refuses locks (some NFS mounts answer ``ENOLCK``), go on without one, for
    callers that stay correct unlocked and lock only to avoid duplicate work.
    ``remove``: delete the lock file on the way out (for a lock in a directory people read, such as the models
    directory). It is deleted while still held, and whoever then holds a deleted file's lock takes the new file's.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    while True:
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
                try:
                    yield
                finally:
                    if remove:
                        lock_path.unlink(missing_ok=True)
                return
            if remove and not _is_current_file(handle.fileno(), lock_path):
                continue  # its holder deleted it while we waited: lock the file now at that path
            try:
                yield
            finally:
                if remove:
                    lock_path.unlink(missing_ok=True)
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
            return


def _is_current_file(descriptor: int, path: Path) -> bool:
    try:
        found, held = os.stat(path), os.fstat(descriptor)
    except FileNotFoundError:
        return False
    return (found.st_dev, found.st_ino) == (held.st_dev, held.st_ino)


def output_lock(out_dir: Path, stage: str) -> AbstractContextManager[None]:
    return exclusive(out_dir.with_name(out_dir.name + ".lock"),
                     waiting_message=f"another process is producing {out_dir} ({stage}); waiting for it to finish")
