"""How every stage writes its output directory: all of it in ``<out>.partial``, renamed into place only once complete,
so a directory at ``<out>`` is always a finished one (its completion marker or record written last, by the stage).

Before any work the partial directory is cleared (what an interrupted run left) and the disk is checked for the
room the stage says it needs. A stage that fails leaves nothing: the partial directory is removed, and a full
disk becomes one error naming where to free space. A process killed outright cannot clean up; the next run clears
what it left.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from enginesmith.core.diskspace import disk_filled_error, is_disk_full, require_free_space

PARTIAL_SUFFIX = ".partial"
DISK_HINT = "free some space, or give --out on a larger disk"


def write_whole(path: Path, text: str) -> None:
    """Write a file whole or not at all: a temporary file of this process's beside it, renamed over ``path`` (two
    writers of the same content each rename their own)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}{PARTIAL_SUFFIX}")
    try:
        partial.write_text(text, encoding="utf-8")
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


def partial_dir(out_dir: Path) -> Path:
    return out_dir.with_name(out_dir.name + PARTIAL_SUFFIX)


@contextmanager
def staged_output(out_dir: Path, *, what: str, need_bytes: int | None = None, where: str = "--out",
                  hint: str = DISK_HINT) -> Iterator[Path]:
    """Yield a fresh ``<out>.partial`` with room for ``need_bytes`` (None: no estimate, no check); when the block
    ends, rename it to ``out_dir``, which the caller has found missing or empty."""
    staging = partial_dir(out_dir)
    shutil.rmtree(staging, ignore_errors=True)
    if need_bytes is not None:
        require_free_space(staging, need_bytes, what=what, where=where, hint=hint)
    staging.mkdir(parents=True)
    try:
        yield staging
        if out_dir.exists():
            out_dir.rmdir()  # only an empty directory: the caller refused one with anything in it
        staging.rename(out_dir)
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if isinstance(error, OSError) and is_disk_full(error):
            raise disk_filled_error(out_dir.parent, what=what, where=where, hint=hint) from None
        raise
