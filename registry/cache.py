"""The local blob cache that pulls share: verified blobs by digest, partial downloads, and pulled artefacts.

```
<cache>/blobs/sha256/<hex>                        verified, read-only; pulled artefacts hard-link to these
<cache>/partial/<hex>.part                        an unfinished download, parked for the next pull to continue
<cache>/partial/<hex>.<host>.<pid>.<nonce>.part   the same, claimed by the process downloading it now
<cache>/partial/<hex>.lock                        held while one process downloads that blob
<cache>/artefacts/<model>/<key16>/                the default destination of a pull
```

Two pulls must never append to one file, and the lock alone cannot promise that: on NFS, Lustre and GPFS, where
GPU clusters keep shared caches, ``flock`` can succeed for every caller. So a download claims its partial file by
renaming it to a name only this process uses (a rename is atomic there too; of two claimants one finds the file
gone and starts a fresh one). The lock is kept where it works, to spare the second download;
``ENGINESMITH_CACHE_LOCKS=off`` skips it on a filesystem known to lie or to refuse locks. A local registry keeps
its unfinished uploads the same way (``PartialFiles``), so a killed publish or copy into it continues too.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from enginesmith.core.diskspace import is_disk_full
from enginesmith.core.errors import UserError
from enginesmith.core.factcache import cache_root
from enginesmith.core.locks import exclusive
from registry.transfer import sha256_file

log = logging.getLogger(__name__)

LOCKS_ENV = "ENGINESMITH_CACHE_LOCKS"
READ_ONLY = 0o444
PART_SUFFIX = ".part"
# A claimed partial file of another host (whose processes this one cannot see) is taken over once it has not grown
# for this long: its download has died.
ABANDONED_CLAIM_S = 3600.0


def default_cache_dir() -> Path:
    """``$ENGINESMITH_CACHE_DIR``, else the user's cache directory (``enginesmith.core.state``)."""
    return cache_root()


def locks_from_environment() -> bool:
    """``ENGINESMITH_CACHE_LOCKS``: ``on`` (the default) or ``off``."""
    value = os.environ.get(LOCKS_ENV, "on").strip().lower()
    if value in ("on", "1", "true", "yes", ""):
        return True
    if value in ("off", "0", "false", "no"):
        return False
    raise UserError(f"{value!r} is not on or off", where=LOCKS_ENV,
                    hint="set it to off where the cache's filesystem has no working flock (some NFS, Lustre, GPFS)")


@dataclass
class Resumed:
    """A transfer continued from a partial file: append to ``path`` from ``offset``, feeding ``digest``."""

    path: Path
    offset: int  # bytes kept from an interrupted run
    digest: hashlib._Hash  # fed with those bytes


class PartialFiles:
    """Unfinished transfers kept in ``directory`` for the next run to continue: the blob cache's downloads, a local
    registry's uploads. Parked as ``<hex>.part``; claimed by the process writing one as
    ``<hex>.<host>.<pid>.<nonce>.part``, which a later run takes over once that process is gone."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def part(self, digest: str) -> Path:
        """Where an interrupted transfer of ``digest`` is parked for the next run."""
        return self.directory / f"{digest}{PART_SUFFIX}"

    def partials(self, digest: str) -> list[Path]:
        """Every partial file of ``digest``: the parked one and those claimed by running or dead transfers."""
        try:
            return sorted(p for p in self.directory.iterdir()
                          if p.name.startswith(digest) and p.name.endswith(PART_SUFFIX))
        except FileNotFoundError:
            return []

    def partial_bytes(self, digest: str) -> int:
        """The longest partial file of ``digest`` on disk (what the next run can continue from at best)."""
        return max((size_or_zero(p) for p in self.partials(digest)), default=0)

    def claim(self, digest: str) -> Path:
        """A partial file of ``digest`` that only this process writes: the parked one or a dead transfer's (the
        longest one this process can take), renamed to a name of its own; a fresh name when none can be taken."""
        own = self.directory / f"{digest}.{_host()}.{os.getpid()}.{uuid.uuid4().hex[:8]}{PART_SUFFIX}"
        own.parent.mkdir(parents=True, exist_ok=True)
        candidates = [p for p in self.partials(digest) if p == self.part(digest) or _abandoned(p, digest)]
        for candidate in sorted(candidates, key=size_or_zero, reverse=True):
            try:
                os.rename(candidate, own)
                return own
            except FileNotFoundError:  # another process claimed it first
                continue
        return own

    def park(self, claimed: Path, digest: str) -> None:
        """Leave an interrupted transfer where the next run finds it (keeping the longer of two parked ones)."""
        if not claimed.exists():
            return
        parked = self.part(digest)
        if size_or_zero(claimed) >= size_or_zero(parked):
            os.replace(claimed, parked)
        else:
            claimed.unlink(missing_ok=True)

    @contextlib.contextmanager
    def resuming(self, digest: str, size: int) -> Iterator[Resumed]:
        """A claimed partial file of ``digest`` (``size`` bytes when whole) and the sha256 of the bytes it keeps, to
        append the rest to. The body moves the file away once its bytes verify; otherwise it is deleted on the way
        out (its bytes were wrong), parked when the body raises (for the next run), deleted on a full disk (the next
        run starts again, on a disk with room)."""
        claimed = self.claim(digest)
        try:
            offset = size_or_zero(claimed)
            if offset > size:
                claimed.unlink()
                offset = 0
            hashed = hashlib.sha256()
            if offset:
                with claimed.open("rb", buffering=0) as kept:
                    hashed = sha256_file(kept, offset)
            yield Resumed(path=claimed, offset=offset, digest=hashed)
        except BaseException as error:
            if is_disk_full(error):
                claimed.unlink(missing_ok=True)
            else:
                self.park(claimed, digest)
            raise
        claimed.unlink(missing_ok=True)


class BlobCache:
    def __init__(self, root: Path, *, use_locks: bool | None = None) -> None:
        self.root = root
        self.use_locks = locks_from_environment() if use_locks is None else use_locks
        self.downloads = PartialFiles(root / "partial")

    def blob(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / digest

    def part(self, digest: str) -> Path:
        """Where an interrupted download of ``digest`` is parked for the next pull."""
        return self.downloads.part(digest)

    def partials(self, digest: str) -> list[Path]:
        """Every partial file of ``digest``: the parked one and those claimed by running or dead downloads."""
        return self.downloads.partials(digest)

    def has(self, digest: str, size: int) -> bool:
        try:
            return self.blob(digest).stat().st_size == size
        except FileNotFoundError:
            return False

    def partial_bytes(self, digest: str) -> int:
        """The longest partial download of ``digest`` on disk (what the next pull can continue from at best)."""
        return self.downloads.partial_bytes(digest)

    def default_dest(self, model: str, key: str) -> Path:
        return self.root / "artefacts" / model / key[:16]

    def commit(self, claimed: Path, digest: str) -> Path:
        """Move a verified download into place, read-only (pulled files are hard links to it)."""
        final = self.blob(digest)
        final.parent.mkdir(parents=True, exist_ok=True)
        claimed.chmod(READ_ONLY)
        os.replace(claimed, final)
        return final

    def locked(self, digest: str) -> AbstractContextManager[None]:
        """Hold the download of one blob where locks work, so a second pull waits and finds it cached."""
        if not self.use_locks:
            return contextlib.nullcontext()
        return exclusive(self.root / "partial" / f"{digest}.lock", best_effort=True)


def link_or_copy(blob: Path, target: Path) -> bool:
    """Place a cached blob at ``target``: a hard link where the filesystem allows (True), else a copy (False)."""
    try:
        os.link(blob, target)
        return True
    except OSError:  # another filesystem, or one without hard links
        shutil.copyfile(blob, target)
        return False


def _host() -> str:
    return "".join(c if c.isalnum() or c == "-" else "_" for c in socket.gethostname())[:32] or "host"


def size_or_zero(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _abandoned(path: Path, digest: str) -> bool:
    """A claimed partial file whose download is gone: its process on this host has exited, or (another host's) it
    has not grown for ``ABANDONED_CLAIM_S``."""
    fields = path.name.removeprefix(digest + ".").removesuffix(PART_SUFFIX).split(".")
    if len(fields) != 3:
        return False
    host, pid_text, _ = fields
    if host == _host() and pid_text.isdigit():
        return not _process_alive(int(pid_text))
    try:
        return time.time() - path.stat().st_mtime > ABANDONED_CLAIM_S
    except FileNotFoundError:
        return False


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another thread of this process: never this download's own claim, but alive
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
