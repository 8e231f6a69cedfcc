"""The local-directory backend (the embedded default): the registry layout as plain files.

Atomicity comes from the filesystem: every file is written under ``tmp/`` in the same directory tree and
then renamed (blobs, refs) or hard-linked (manifests: ``link`` fails if the name exists, which makes the
create exclusive) into place. Refs are swapped under an advisory lock (``flock``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import uuid
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path

from enginesmith.core.diskspace import disk_filled_error, is_disk_full
from enginesmith.core.errors import os_failure
from enginesmith.core.locks import exclusive
from registry.cache import PartialFiles
from registry.errors import IntegrityError, NotFoundError
from registry.manifest import utc_timestamp
from registry.names import (
    BLOBS_DIR,
    MANIFEST_SUFFIX,
    blob_path,
    history_dir,
    history_path,
    is_digest,
    is_name,
    manifest_dir,
    manifest_path,
    ref_path,
    refs_dir,
    stage_dir,
    stage_path,
)
from registry.store import BlobInfo, RefState, StageFile
from registry.transfer import RateLimiter, TransferProgress, file_chunks, owned_chunks, write_hashing

TMP_DIR = "tmp"
READ_ONLY = 0o444


class LocalStore:
    """A registry in a directory on this machine."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uploads = PartialFiles(root / TMP_DIR)

    @property
    def location(self) -> str:
        return str(self.root)

    @property
    def identity(self) -> str:
        return f"file://{self.root.resolve()}"

    @property
    def shares_namespace(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    # --- blobs ---------------------------------------------------------------------------------------

    def blob_size(self, digest: str) -> int | None:
        try:
            return (self.root / blob_path(digest)).stat().st_size
        except _ABSENT:
            return None

    def put_blob(self, digest: str, source: Path, *, limiter: RateLimiter | None = None,
                 progress: TransferProgress | None = None, name: str = "") -> int:
        """Continues a partial upload an interrupted run left under ``tmp/`` (``PartialFiles``, as pulls continue
        theirs): the bytes kept are hashed, not read from ``source`` again. Kept bytes that do not match are thrown
        away and the blob is copied once more from its start."""
        with self._os_errors(f"writing blob sha256:{digest[:12]}"):
            return self._put_blob(digest, source, limiter, progress, name)

    def _put_blob(self, digest: str, source: Path, limiter: RateLimiter | None, progress: TransferProgress | None,
                  name: str) -> int:
        final = self.root / blob_path(digest)
        final.parent.mkdir(parents=True, exist_ok=True)
        size = source.stat().st_size
        kept_bytes = 0
        for attempt in (1, 2):
            with self.uploads.resuming(digest, size) as partial:
                kept_bytes = partial.offset if attempt == 1 else 0
                if progress is not None:
                    progress.started(name, size, partial.offset)
                try:
                    with source.open("rb", buffering=0) as reader, partial.path.open("ab", buffering=0) as writer:
                        reader.seek(partial.offset)
                        write_hashing(file_chunks(reader), writer, partial.digest, limit_bytes=size - partial.offset,
                                      limiter=limiter, progress=progress, name=name)
                        os.fsync(writer.fileno())
                finally:
                    if progress is not None:
                        progress.finished(name)
                if partial.digest.hexdigest() == digest:
                    partial.path.chmod(READ_ONLY)
                    os.replace(partial.path, final)
                    return kept_bytes
                if not partial.offset:
                    break
        raise IntegrityError(
            f"content has sha256 {partial.digest.hexdigest()}, not {digest}", where=name or str(source),
            hint="the file changed while it was being published; rebuild the artefact",
        )

    def read_blob(self, digest: str, offset: int = 0) -> Generator[bytes, None, None]:
        try:
            handle = (self.root / blob_path(digest)).open("rb", buffering=0)
        except FileNotFoundError:
            raise NotFoundError(f"blob sha256:{digest} is missing from the registry", where=self.location,
                                hint="re-publish the artefact that lists it") from None
        with handle:
            handle.seek(offset)
            yield from owned_chunks(handle)

    def list_blobs(self) -> Generator[BlobInfo, None, None]:
        try:
            entries = list(os.scandir(self.root / BLOBS_DIR))
        except FileNotFoundError:
            return
        for entry in entries:
            if is_digest(entry.name) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    stat = entry.stat(follow_symlinks=False)
                    yield BlobInfo(digest=entry.name, size=stat.st_size, modified=stat.st_mtime)

    def delete_blob(self, digest: str) -> None:
        with self._os_errors(f"deleting blob sha256:{digest[:12]}"):
            (self.root / blob_path(digest)).unlink(missing_ok=True)

    # --- manifests -----------------------------------------------------------------------------------

    def create_manifest(self, model: str, key: str, body: bytes) -> bool:
        return self._create_once(self.root / manifest_path(model, key), key, body)

    def _create_once(self, final: Path, key: str, body: bytes) -> bool:
        with self._os_errors(f"writing {final.relative_to(self.root)}"):
            return self._link_once(final, key, body)

    def _link_once(self, final: Path, key: str, body: bytes) -> bool:
        final.parent.mkdir(parents=True, exist_ok=True)
        with self._temp_file(key) as temp:
            self._write_durably(temp, body)
            try:
                os.link(temp, final)
            except FileExistsError:
                return False
        _fsync_directory(final.parent)
        return True

    def read_manifest(self, model: str, key: str) -> bytes | None:
        return _read_or_none(self.root / manifest_path(model, key))

    def delete_manifest(self, model: str, key: str) -> None:
        with self._os_errors(f"deleting manifest {model}@{key[:12]}"):
            (self.root / manifest_path(model, key)).unlink(missing_ok=True)

    def list_models(self) -> list[str]:
        return sorted(p.name for p in _children(self.root / "manifests") if p.is_dir() and is_name(p.name))

    def list_manifest_keys(self, model: str) -> list[str]:
        directory = self.root / manifest_dir(model)
        keys = [p.name.removesuffix(MANIFEST_SUFFIX) for p in _children(directory) if p.name.endswith(MANIFEST_SUFFIX)]
        return sorted(k for k in keys if is_name(k))

    # --- stage records -------------------------------------------------------------------------------

    def create_stage(self, stage: str, key: str, body: bytes, files: Sequence[StageFile] = ()) -> bool:
        return self._create_once(self.root / stage_path(stage, key), key, body)

    def read_stage(self, stage: str, key: str) -> bytes | None:
        return _read_or_none(self.root / stage_path(stage, key))

    def list_stage_keys(self, stage: str) -> list[str]:
        names = [p.name.removesuffix(MANIFEST_SUFFIX) for p in _children(self.root / stage_dir(stage))]
        return sorted(k for k in names if is_name(k))

    def delete_stage(self, stage: str, key: str) -> None:
        with self._os_errors(f"deleting stage record {stage}/{key[:12]}"):
            (self.root / stage_path(stage, key)).unlink(missing_ok=True)

    # --- history records -----------------------------------------------------------------------------

    def create_history(self, model: str, entry: str, body: bytes) -> bool:
        return self._create_once(self.root / history_path(model, entry), entry, body)

    def read_history(self, model: str, entry: str) -> bytes | None:
        return _read_or_none(self.root / history_path(model, entry))

    def list_history(self, model: str) -> list[str]:
        names = [p.name.removesuffix(MANIFEST_SUFFIX) for p in _children(self.root / history_dir(model))
                 if p.name.endswith(MANIFEST_SUFFIX)]
        return sorted(n for n in names if is_name(n))

    # --- refs ----------------------------------------------------------------------------------------

    def read_ref(self, model: str, channel: str) -> RefState | None:
        path = self.root / ref_path(model, channel)
        body = _read_or_none(path)
        if body is None:
            return None
        try:
            record = json.loads(body)
            return RefState(key=str(record["key"]), version=_version(body), updated=str(record.get("updated", "")))
        except (ValueError, KeyError, TypeError):
            raise IntegrityError(
                "ref file is damaged", where=str(path),
                hint="delete the file, then point the channel again with `enginesmith promote`",
            ) from None

    def write_ref(self, model: str, channel: str, key: str, expected: RefState | None) -> bool:
        with self._os_errors(f"moving ref {model}:{channel}"):
            return self._swap_ref(model, channel, key, expected)

    def _swap_ref(self, model: str, channel: str, key: str, expected: RefState | None) -> bool:
        path = self.root / ref_path(model, channel)
        path.parent.mkdir(parents=True, exist_ok=True)
        with exclusive(path.parent / f".{channel}.lock"):
            current = _read_or_none(path)
            current_version = None if current is None else _version(current)
            if current_version != (None if expected is None else expected.version):
                return False
            body = json.dumps({"key": key, "updated": utc_timestamp()}).encode() + b"\n"
            with self._temp_file(channel) as temp:
                self._write_durably(temp, body)
                os.replace(temp, path)
        return True

    def list_channels(self, model: str) -> list[str]:
        directory = self.root / refs_dir(model)
        return sorted(p.name for p in _children(directory) if p.is_file() and is_name(p.name))

    # --- housekeeping --------------------------------------------------------------------------------

    def delete_stale_uploads(self, older_than_s: float, *, now: float | None = None) -> int:
        cutoff = (time.time() if now is None else now) - older_than_s
        removed = 0
        for path in _children(self.root / TMP_DIR):
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_mtime < cutoff:
                    path.unlink()
                    removed += 1
        return removed

    def require_exists(self, where: str) -> None:
        if not self.root.is_dir():
            raise NotFoundError(f"no registry at {self.root}: the directory does not exist", where=where,
                                hint="check the path; `enginesmith publish` and `enginesmith copy` make a registry "
                                     "directory where they write")

    @contextlib.contextmanager
    def _os_errors(self, doing: str) -> Iterator[None]:
        """An OS error while writing the registry (a directory one cannot write, a read-only or full filesystem) as
        one line naming the path; what was half-written is removed by the writer (``_temp_file``)."""
        try:
            yield
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_filled_error(self.root, what=doing, where=self.location,
                                        hint="free some space, or use a registry on a larger disk") from None
            raise os_failure(exc, doing=doing, where=self.location,
                             hint="check that this user can write there and the filesystem is not read-only"
                             ) from None

    @contextlib.contextmanager
    def _temp_file(self, label: str) -> Iterator[Path]:
        """A fresh path under ``tmp/`` (same filesystem as the final names, so a rename is atomic); removed
        afterwards unless it was renamed away."""
        directory = self.root / TMP_DIR
        directory.mkdir(parents=True, exist_ok=True)
        temp = directory / f"{label[:64]}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp"
        try:
            yield temp
        finally:
            temp.unlink(missing_ok=True)

    @staticmethod
    def _write_durably(path: Path, body: bytes) -> None:
        with path.open("xb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())


# Nothing is under a path one of whose parents is a file: absent, as where no parent exists.
_ABSENT = (FileNotFoundError, NotADirectoryError)
_READ_HINT = "check that this user can read the registry directory"


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except _ABSENT:
        return None
    except OSError as exc:
        raise os_failure(exc, doing=f"reading {path.name}", hint=_READ_HINT) from None


def _version(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _children(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except _ABSENT:
        return []
    except OSError as exc:
        raise os_failure(exc, doing=f"listing {directory.name}", hint=_READ_HINT) from None


def _fsync_directory(directory: Path) -> None:
    """Make a new directory entry durable (a manifest must not vanish after a power cut once published)."""
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
