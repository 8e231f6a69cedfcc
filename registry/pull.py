"""Pull one artefact: fetch the blobs the cache lacks, verify each, lay the files out under a destination.

Each blob is fetched in one pass that hashes and writes (``registry.transfer.write_hashing``), continuing a
partial download with a range request from where it stopped. A blob whose bytes do not match its sha256 is
deleted and fetched once more; a second mismatch fails the pull, naming the file. The destination is built
next to its final name from hard links into the cache and renamed into place, so it is never half there.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Generator, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, computed_field

from enginesmith.core.artefacts import ARTEFACT_FILE, artefact_record_bytes
from enginesmith.core.checkpoints.models import CheckpointFile
from enginesmith.core.diskspace import disk_filled_error, is_disk_full, require_free_space, same_filesystem
from enginesmith.core.errors import UserError, os_failure
from enginesmith.core.factcache import CACHE_ENV
from registry.cache import BlobCache, link_or_copy
from registry.errors import IntegrityError, RegistryUnavailableError, SignatureError, UnsafePathError
from registry.manifest import (
    PUBLICATION_FILE,
    PULL_RECORD_FILE,
    SIGNATURE_FILE,
    Manifest,
    files_by_digest,
    unsafe_path_reason,
    utc_timestamp,
)
from registry.signing import (
    SignatureCheck,
    Trust,
    check_signature,
    publication_record_bytes,
    read_signature,
    require_channel_signer,
)
from registry.store import RegistryStore
from registry.transfer import (
    RateLimiter,
    TransferCancelled,
    TransferProgress,
    read_ahead,
    sha256_file,
    write_hashing,
)

DEFAULT_PULL_JOBS = 8
FETCH_ATTEMPTS = 2
# Reads of one blob cut in a row without a byte arriving before the pull gives up (the count restarts on progress).
RESUME_ATTEMPTS = 5
RESUME_BACKOFF_S = 0.5
RESUME_BACKOFF_MAX_S = 8.0
READ_AHEAD_CHUNKS = 16  # 4 MiB of network chunks, 64 MiB of local ones, per blob in flight
_DISK_HINT = f"free some space, or point {CACHE_ENV} (the cache) and --dest at a larger disk"

log = logging.getLogger(__name__)


class PlannedBlob(BaseModel):
    sha256: str
    size: int
    paths: list[str]
    state: Literal["cached", "partial", "missing"]
    partial_bytes: int  # already on disk from an earlier, interrupted pull

    @property
    def label(self) -> str:
        return self.paths[0] if len(self.paths) == 1 else f"{self.paths[0]} (+{len(self.paths) - 1} identical)"


class PullPlan(BaseModel):
    model: str
    key: str
    registry: str
    dest: str
    files: int
    total_bytes: int
    blobs: list[PlannedBlob]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def bytes_to_fetch(self) -> int:
        return sum(b.size - b.partial_bytes for b in self.blobs if b.state != "cached")


class ChosenProfile(BaseModel):
    """The serving profile a pull chose for an SLO: the one ``enginesmith serve`` starts the files with."""

    name: str
    runtime: str  # the serve recipe it applies to
    args: list[str]  # the flags it sets on that recipe's command
    slo: str
    concurrency: int  # the level at which it met the SLO with the most goodput
    goodput: float | None  # requests/s within the SLO there


class PullResult(BaseModel):
    model: str
    key: str
    registry: str
    dest: str
    dry_run: bool
    files: int
    total_bytes: int
    cached_bytes: int  # already verified in the cache: not fetched
    resumed_bytes: int  # kept from interrupted downloads: not fetched again
    downloaded_bytes: int
    refetched: list[str]  # files whose first download did not match its sha256
    linked_files: int
    copied_files: int  # where the cache and the destination are on different filesystems
    plan: PullPlan
    profile: ChosenProfile | None = None  # the serving profile chosen for an SLO (recorded beside the files)
    signature: SignatureCheck | None = None  # who signed it, checked against the trust list (None: no trust list)


class PullRecord(BaseModel):
    """``.enginesmith-pull.json`` in a pulled directory: where its files came from (and, for an SLO, with which
    serving profile to serve them)."""

    registry: str
    model: str
    key: str
    pulled: str
    manifest: Manifest
    profile: ChosenProfile | None = None
    signature: SignatureCheck | None = None  # the signature as checked at pull time, with the trust list given


def read_pull_record(artefact_dir: Path) -> PullRecord | None:
    """The record of a pulled directory; None for a directory pull did not write (a build's own output)."""
    path = artefact_dir / PULL_RECORD_FILE
    return PullRecord.model_validate_json(path.read_text()) if path.is_file() else None


@dataclass
class _FetchStats:
    resumed_bytes: int = 0
    downloaded_bytes: int = 0
    refetched: bool = False


def plan_pull(manifest: Manifest, cache: BlobCache, dest: Path, registry: str) -> PullPlan:
    """What a pull of ``manifest`` would fetch with this cache (what ``--dry-run`` prints)."""
    blobs = []
    for digest, entries in manifest.files_by_digest().items():
        size = entries[0].size
        partial = cache.partial_bytes(digest)
        state: Literal["cached", "partial", "missing"] = (
            "cached" if cache.has(digest, size) else "partial" if 0 < partial <= size else "missing"
        )
        blobs.append(PlannedBlob(sha256=digest, size=size, paths=[e.path for e in entries], state=state,
                                 partial_bytes=partial if state == "partial" else 0))
    return PullPlan(model=manifest.model, key=manifest.key, registry=registry, dest=str(dest),
                    files=len(manifest.artefact.files), total_bytes=manifest.total_bytes, blobs=blobs)


def check_pull_trust(store: RegistryStore, manifest: Manifest, signature_body: bytes | None, trust: Trust, *,
                     channel: str | None = None, profile: ChosenProfile | None = None) -> SignatureCheck:
    """That ``manifest`` may be pulled under ``trust``: its signature holds, its signer may be on ``channel`` (the one
    it was found through), whose newest signed statement names it (``registry.channel_statements.check_channel``),
    and covers the report a ``profile`` comes from. Raises ``SignatureError`` otherwise; the
    CLI asks before it draws a progress bar, ``pull_artefact`` again before it fetches."""
    checked = check_signature(manifest, signature_body, trust, where=store.location)  # its message names the ref
    if channel is not None:
        require_channel_signer(checked, manifest, channel, trust, where=f"{store.location}: {manifest.model}:{channel}",
                               hint="do not deploy it; ask who moved the channel")
        from registry.channel_statements import check_channel

        check_channel(store, manifest.model, channel, manifest.key, trust)
    if profile is not None and checked.covers == "artefact":
        # A profile's flags start the server; from a report no trusted key signed, they are not taken.
        raise SignatureError(f"the serving profile would come from {manifest.ref}'s validation report, which its "
                             "signature does not cover", where=store.location,
                             hint="pull without --slo (the artefact's files are signed), or publish it signed "
                                  "with --sign-key, which covers the report")
    return checked


def pull_artefact(
    store: RegistryStore,
    manifest: Manifest,
    *,
    dest: Path,
    cache: BlobCache,
    jobs: int = DEFAULT_PULL_JOBS,
    limiter: RateLimiter | None = None,
    progress: TransferProgress | None = None,
    dry_run: bool = False,
    profile: ChosenProfile | None = None,
    trust: Trust | None = None,
    channel: str | None = None,
    checked_signature: tuple[bytes | None, SignatureCheck] | None = None,
) -> PullResult:
    """Fetch what the cache lacks (``jobs`` blobs at a time) and lay the artefact out at ``dest``. With ``trust``,
    the manifest's signature is checked first: an unsigned, untrusted or invalid one raises ``SignatureError`` before
    anything is fetched or written, as does a signer the trust list does not allow on ``channel`` (the channel the
    manifest was found through), and a ``profile`` from a validation report the signature does not cover.
    ``checked_signature`` (the signature's bytes and what ``check_pull_trust`` found of them, for this ``trust``)
    saves checking again what the caller checked.

    Raises ``IntegrityError`` naming the file whose bytes failed their sha256 twice, ``NotFoundError`` for a
    blob the registry lacks, ``RegistryUnavailableError`` when the storage stops answering (a later pull
    resumes), ``UserError`` for a destination it may not replace.
    """
    for entry in manifest.artefact.files:
        reason = unsafe_path_reason(entry.path)
        if reason:  # Manifest refuses these already; a manifest built in code must not bypass that
            raise UnsafePathError(f"path {entry.path!r} {reason}", where=manifest.ref)
    check_destination(dest)
    checked = None
    if trust is not None and checked_signature is not None:
        signature_body, checked = checked_signature
    else:
        signature_body = read_signature(store, manifest)
        if trust is not None:
            checked = check_pull_trust(store, manifest, signature_body, trust, channel=channel, profile=profile)
    plan = plan_pull(manifest, cache, dest, store.location)
    result = PullResult(
        model=manifest.model, key=manifest.key, registry=store.location, dest=str(dest), dry_run=dry_run,
        files=plan.files, total_bytes=plan.total_bytes,
        cached_bytes=sum(b.size for b in plan.blobs if b.state == "cached"),
        resumed_bytes=0, downloaded_bytes=0, refetched=[], linked_files=0, copied_files=0, plan=plan,
        profile=profile, signature=checked,
    )
    if dry_run:
        return result
    # Under a trust list, what the cache holds is hashed too, not judged by its size: a pulled file is a hard link
    # to its cached blob, and a changed one (edited in place, or in a shared cache) is fetched again.
    changed = _changed_cached_blobs(plan, cache) if trust is not None else []
    result.cached_bytes -= sum(b.size for b in changed)
    check_free_space(plan, cache, dest)
    to_fetch = [b for b in plan.blobs if b.state != "cached"]
    what = f"pulling {manifest.ref}"
    try:
        stats = _fetch_all(store, cache, to_fetch, jobs, limiter, progress)
        result.resumed_bytes = sum(s.resumed_bytes for s in stats)
        result.downloaded_bytes = sum(s.downloaded_bytes for s in stats)
        result.refetched = [b.label for b in changed] + [
            blob.label for blob, s in zip(to_fetch, stats, strict=True) if s.refetched]
        result.linked_files, result.copied_files = _lay_out(store.location, manifest, cache, dest, profile,
                                                            signature_body, checked)
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_filled_error(cache.root, what=what, where=str(cache.root), hint=_DISK_HINT) from None
        raise
    return result


def _changed_cached_blobs(plan: PullPlan, cache: BlobCache) -> list[PlannedBlob]:
    """The planned blobs the cache holds whose bytes no longer hash to their digest: each is removed from the cache
    and planned as missing."""
    changed = []
    for blob in plan.blobs:
        if blob.state != "cached":
            continue
        with cache.blob(blob.sha256).open("rb", buffering=0) as cached:
            intact = sha256_file(cached).hexdigest() == blob.sha256
        if not intact:
            cache.blob(blob.sha256).unlink(missing_ok=True)
            blob.state = "missing"
            changed.append(blob)
    return changed


def fetch_files(store: RegistryStore, files: list[CheckpointFile], cache: BlobCache, *, what: str,
                jobs: int = DEFAULT_PULL_JOBS, limiter: RateLimiter | None = None) -> int:
    """Fetch into ``cache`` the blobs of ``files`` it lacks, resumed and verified as ``pull_artefact`` fetches them;
    returns the bytes downloaded. For records that are not artefacts (a stage output handed between nodes)."""
    for entry in files:
        reason = unsafe_path_reason(entry.path)
        if reason or entry.sha256 is None:
            raise UnsafePathError(f"path {entry.path!r} {reason or 'has no sha256'}", where=what)
    missing = [PlannedBlob(sha256=digest, size=entries[0].size, paths=[e.path for e in entries], state="missing",
                           partial_bytes=0)
               for digest, entries in files_by_digest(files).items() if not cache.has(digest, entries[0].size)]
    require_free_space(cache.root, sum(b.size for b in missing), what=what, where=f"{cache.root} ({CACHE_ENV})",
                       hint=_DISK_HINT)
    try:
        return sum(s.downloaded_bytes for s in _fetch_all(store, cache, missing, jobs, limiter, None))
    except OSError as exc:
        if is_disk_full(exc):
            raise disk_filled_error(cache.root, what=what, where=str(cache.root), hint=_DISK_HINT) from None
        raise


def check_free_space(plan: PullPlan, cache: BlobCache, dest: Path) -> None:
    """Raises ``DiskFullError`` unless there is room, before anything is written, for what is fetched in the cache,
    and for a copy at ``dest`` where the two are on different filesystems (hard links need none)."""
    what = f"pulling {plan.model}@{plan.key[:12]}"
    require_free_space(cache.root, plan.bytes_to_fetch, what=what, where=f"{cache.root} ({CACHE_ENV})",
                       hint=_DISK_HINT)
    if not same_filesystem(cache.root, dest):
        require_free_space(dest, plan.total_bytes, what=f"{what} (copied: {dest} is on another filesystem than the "
                           "cache)", where="--dest", hint=_DISK_HINT)


def _fetch_all(store: RegistryStore, cache: BlobCache, blobs: list[PlannedBlob], jobs: int,
               limiter: RateLimiter | None, progress: TransferProgress | None) -> list[_FetchStats]:
    """Fetch ``blobs``, ``jobs`` at a time. The first failure (or Ctrl-C) stops the others at their next chunk,
    keeping their partial files for the next pull, and is raised."""
    cancel = threading.Event()
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        futures = [pool.submit(_fetch_blob, store, cache, blob, limiter, progress, cancel) for blob in blobs]
        try:
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:
            cancel.set()
            raise
        failures = [f.exception() for f in futures if f in done and f.exception() is not None]
        if failures:
            cancel.set()
    first_failure = next((e for e in failures if not isinstance(e, TransferCancelled)), None)
    if first_failure is not None:
        raise first_failure
    return [f.result() for f in futures]


def _fetch_blob(store: RegistryStore, cache: BlobCache, blob: PlannedBlob, limiter: RateLimiter | None,
                progress: TransferProgress | None, cancel: threading.Event) -> _FetchStats:
    stats = _FetchStats()
    with cache.locked(blob.sha256):
        if cache.has(blob.sha256, blob.size):  # another pull sharing this cache fetched it meanwhile
            return stats
        for attempt in range(1, FETCH_ATTEMPTS + 1):
            with cache.downloads.resuming(blob.sha256, blob.size) as partial:
                offset, digest = partial.offset, partial.digest
                if attempt == 1:
                    stats.resumed_bytes = offset
                if progress is not None:
                    progress.started(blob.label, blob.size, offset)
                try:
                    written = _download_resuming(store, blob, partial.path, offset, digest, limiter, progress, cancel)
                finally:
                    if progress is not None:
                        progress.finished(blob.label)
                stats.downloaded_bytes += written
                if offset + written == blob.size and digest.hexdigest() == blob.sha256:
                    cache.commit(partial.path, blob.sha256)
                    return stats
            stats.refetched = True
            if attempt == FETCH_ATTEMPTS:
                raise IntegrityError(
                    f"{', '.join(blob.paths)}: fetched twice, and the bytes ({offset + written} of {blob.size}) "
                    f"do not match sha256 {blob.sha256}",
                    where=store.location,
                    hint="the registry's copy of this blob is damaged or was altered: nothing of it was kept. "
                         "Re-publish the artefact from its build, or pull it from a registry you trust",
                )
    return stats


class _SourceInterrupted(Exception):
    """The registry stopped sending a blob mid-way (as opposed to this side failing to write it)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _interruptible(chunks: Iterator[bytes]) -> Generator[bytes, None, None]:
    try:
        yield from chunks
    except (RegistryUnavailableError, OSError) as exc:
        raise _SourceInterrupted(exc) from exc


def _download_resuming(store: RegistryStore, blob: PlannedBlob, part: Path, offset: int, digest: hashlib._Hash,
                       limiter: RateLimiter | None, progress: TransferProgress | None,
                       cancel: threading.Event) -> int:
    """Append the blob from ``offset`` to ``part``, continuing from where a cut read stopped; returns bytes written.

    The retry budget counts failures in a row without a byte arriving, and starts again whenever bytes arrive, so a
    flaky connection that keeps delivering finishes, and a dead server fails after ``RESUME_ATTEMPTS`` tries.
    """
    start = offset
    failures_in_a_row = 0
    with part.open("ab", buffering=0) as writer:
        while offset < blob.size:
            try:
                with contextlib.closing(
                    read_ahead(_interruptible(store.read_blob(blob.sha256, offset)), READ_AHEAD_CHUNKS)
                ) as chunks:
                    write_hashing(chunks, writer, digest, limit_bytes=blob.size - offset, limiter=limiter,
                                  progress=progress, name=blob.label, cancel=cancel)
                return os.fstat(writer.fileno()).st_size - start
            except _SourceInterrupted as interrupted:
                reached = os.fstat(writer.fileno()).st_size
                failures_in_a_row = 1 if reached > offset else failures_in_a_row + 1
                offset = reached
                if failures_in_a_row >= RESUME_ATTEMPTS:
                    cause = interrupted.cause
                    reason = cause.message if isinstance(cause, UserError) else f"{type(cause).__name__}: {cause}"
                    raise RegistryUnavailableError(
                        f"{reason}; {blob.label}: fetched {offset - start} bytes in this pull, {offset} of "
                        f"{blob.size} are in the cache after {failures_in_a_row} tries without progress",
                        where=store.location,
                        hint=f"check that the server is up; run the same command again and it resumes from byte "
                             f"{offset}",
                    ) from None
                wait_s = min(RESUME_BACKOFF_MAX_S, RESUME_BACKOFF_S * 2 ** (failures_in_a_row - 1))
                log.warning("%s: the read stopped at byte %d of %d (%s); resuming there in %.1f s (try %d of %d)",
                            blob.label, offset, blob.size, interrupted, wait_s, failures_in_a_row + 1, RESUME_ATTEMPTS)
                if cancel.wait(wait_s):
                    raise TransferCancelled(blob.label) from None
    return offset - start


def check_destination(dest: Path) -> None:
    """Raises ``UserError`` for a destination pull may not write: it replaces only a directory it wrote itself (or an
    empty one), never a user's files, and it needs a writable directory to stage the files in."""
    if dest.is_symlink():
        raise UserError(f"{dest} is a symbolic link", where="--dest",
                        hint="give the real directory; pull replaces its destination and would drop the link")
    if dest.exists() and not dest.is_dir():
        raise UserError(f"{dest} exists and is not a directory", where="--dest", hint="choose another --dest")
    if dest.is_dir() and any(dest.iterdir()) and not (dest / PULL_RECORD_FILE).is_file():
        raise UserError(f"{dest} is not empty and was not written by enginesmith pull", where="--dest",
                        hint="choose a new or empty directory; pull replaces a directory only if it wrote it")
    # The artefact is staged beside dest and renamed into place: the nearest directory that exists must take writes.
    existing = next(parent for parent in dest.absolute().parents if parent.exists())
    if not existing.is_dir():
        raise UserError(f"{existing} is a file: cannot lay out {dest} under it", where="--dest",
                        hint="choose a --dest whose parents are directories (nothing was fetched or written)")
    if not os.access(existing, os.W_OK | os.X_OK):
        why = "is on a read-only filesystem" if _read_only_filesystem(existing) else "is not writable by this user"
        raise UserError(f"{existing} {why}: cannot lay out {dest.name} there", where="--dest",
                        hint="choose a --dest on a writable disk (nothing was fetched or written)")


def _read_only_filesystem(path: Path) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def _lay_out(registry: str, manifest: Manifest, cache: BlobCache, dest: Path, profile: ChosenProfile | None,
             signature_body: bytes | None, checked: SignatureCheck | None) -> tuple[int, int]:
    """Build the artefact directory next to ``dest`` and rename it into place; returns (linked, copied) files.

    An OS error on the way (an immutable or busy ``dest``, a read-only mount, a name too long) is a ``UserError``
    naming the path; the fetched blobs stay in the cache, so the next pull only lays the files out."""
    try:
        return _stage_and_rename(registry, manifest, cache, dest, profile, signature_body, checked)
    except OSError as exc:
        if is_disk_full(exc):
            raise
        raise os_failure(exc, doing=f"laying out {dest}", where="--dest",
                         hint="choose another --dest, or fix that path's permissions or attributes (the files are "
                              "in the cache: the next pull fetches nothing)") from None


def _stage_and_rename(registry: str, manifest: Manifest, cache: BlobCache, dest: Path, profile: ChosenProfile | None,
                      signature_body: bytes | None, checked: SignatureCheck | None) -> tuple[int, int]:
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:12]}.partial"
    staging.mkdir()
    linked = copied = 0
    try:
        for entry in manifest.artefact.files:
            assert entry.sha256 is not None
            target = staging / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            if link_or_copy(cache.blob(entry.sha256), target):
                linked += 1
            else:
                copied += 1
        (staging / ARTEFACT_FILE).write_bytes(artefact_record_bytes(manifest.artefact))
        (staging / PUBLICATION_FILE).write_bytes(publication_record_bytes(manifest))
        if signature_body is not None:
            (staging / SIGNATURE_FILE).write_bytes(signature_body)
        record = PullRecord(registry=registry, model=manifest.model, key=manifest.key, pulled=utc_timestamp(),
                            manifest=manifest, profile=profile, signature=checked)
        (staging / PULL_RECORD_FILE).write_text(record.model_dump_json(indent=2) + "\n")
        check_destination(dest)
        if dest.exists():
            retired = dest.parent / f".{dest.name}.{uuid.uuid4().hex[:12]}.old"
            os.rename(dest, retired)
            os.rename(staging, dest)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.rename(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return linked, copied
