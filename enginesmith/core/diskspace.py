"""Free disk space, checked before a stage writes (pull, checkpoint download, quantise, build), and a full disk
found mid-write turned into an error that says where and how much.

A check before the write only narrows the window: another process can fill the disk meanwhile, so every writer
also cleans up its half-written output when ``ENOSPC`` arrives (``is_disk_full``).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from enginesmith.core.errors import UserError

GIB = 1024**3
MIB = 1024**2
# Left free on top of what a write needs: logs, temp files and the runtime's own scratch must still fit.
DEFAULT_HEADROOM_BYTES = 64 * MIB


class DiskFullError(UserError):
    """Not enough free space for a write, found before it (bytes needed vs free) or during it (``ENOSPC``)."""


def existing_ancestor(path: Path) -> Path:
    """``path`` or its nearest ancestor that exists (the filesystem a new path would land on)."""
    current = path.absolute()
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(existing_ancestor(path)).free


def same_filesystem(first: Path, second: Path) -> bool:
    return existing_ancestor(first).stat().st_dev == existing_ancestor(second).stat().st_dev


def require_free_space(path: Path, needed_bytes: int, *, what: str, where: str, hint: str,
                       headroom_bytes: int = DEFAULT_HEADROOM_BYTES) -> None:
    """Raise ``DiskFullError`` unless the filesystem holding ``path`` has ``needed_bytes`` plus headroom free.

    ``what`` names the write ("pulling tiny-llama@3f2a…"), ``where`` the setting that chose the path.
    """
    if needed_bytes <= 0:
        return
    free = free_bytes(path)
    if needed_bytes + headroom_bytes > free:
        raise DiskFullError(
            f"not enough disk for {what}: it needs {describe_bytes(needed_bytes)} "
            f"(+{describe_bytes(headroom_bytes)} headroom) in {path}, and that filesystem has "
            f"{describe_bytes(free)} free ({needed_bytes} bytes needed, {free} free)",
            where=where, hint=hint,
        )


def is_disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_filled_error(path: Path, *, what: str, where: str, hint: str) -> DiskFullError:
    """The error for ``ENOSPC`` met while writing under ``path`` (after whatever was half-written is removed)."""
    return DiskFullError(
        f"the disk filled while {what}: {path} has {describe_bytes(free_bytes(path))} free now; nothing "
        f"half-written was kept", where=where, hint=hint,
    )


def size_label(count: int) -> str:
    """A size for tables: bytes as a count, larger sizes in binary units to one decimal."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} TiB"


def describe_bytes(count: int) -> str:
    if count >= GIB:
        return f"{count / GIB:.2f} GiB"
    if count >= MIB:
        return f"{count / MIB:.1f} MiB"
    return f"{count / 1024:.1f} KiB"
