"""The storage interface every backend implements, and ``open_store`` to pick one from a registry URL.

The interface speaks the registry's own terms (blobs by digest, immutable manifests, refs with
compare-and-swap) rather than generic objects, so that an OCI registry can implement it later with its own
primitives (blob uploads, manifest PUT, tags).
"""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from enginesmith.core.diskspace import existing_ancestor
from enginesmith.core.errors import UserError
from registry.transfer import RateLimiter, TransferProgress


@dataclass(frozen=True)
class BlobInfo:
    digest: str
    size: int
    modified: float  # seconds since the epoch


@dataclass(frozen=True)
class StageFile:
    """A file of a stage output, as its record names it: the blob that holds it."""

    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class RefState:
    """A ref as read: the manifest key it points to, and an opaque version for compare-and-swap."""

    key: str
    version: str
    updated: str = ""


class RegistryStore(Protocol):
    """One registry's storage. Paths and names are checked by the caller (``registry.names``)."""

    @property
    def location(self) -> str:
        """Where the registry is, for messages (never with credentials)."""
        ...

    @property
    def identity(self) -> str:
        """Which registry this is however it was typed (a local directory's resolved path, an S3 bucket and prefix
        with its endpoint, an OCI registry's host and namespace): what a node's trust state is kept under and what
        a channel statement names, so that neither follows another spelling or another registry."""
        ...

    @property
    def shares_namespace(self) -> bool:
        """Whether other tools write records where this store keeps its manifests (an OCI registry's repositories),
        so that a listing counts only what reads as ours."""
        ...

    def blob_size(self, digest: str) -> int | None:
        """The stored size of a blob, or ``None`` if it is absent."""
        ...

    def put_blob(self, digest: str, source: Path, *, limiter: RateLimiter | None = None,
                 progress: TransferProgress | None = None, name: str = "") -> int:
        """Store ``source`` as blob ``digest``; it becomes visible only when complete.

        Reports its progress under ``name`` (started, advanced, finished), counting bytes an interrupted
        upload had already stored as done. Returns how many bytes it did not send because they were stored
        already (0 where the backend cannot resume).

        Raises ``IntegrityError`` if the bytes do not hash to ``digest`` (where the backend hashes as it
        copies; the publisher checks beforehand in any case).
        """
        ...

    def read_blob(self, digest: str, offset: int = 0) -> Generator[bytes, None, None]:
        """The bytes of a blob from ``offset`` to its end, in chunks the caller may keep; close the generator
        when done.

        Raises ``NotFoundError`` for an absent blob and ``RegistryUnavailableError`` when the storage stops
        answering mid-way.
        """
        ...

    def list_blobs(self) -> Generator[BlobInfo, None, None]: ...

    def delete_blob(self, digest: str) -> None: ...

    def create_manifest(self, model: str, key: str, body: bytes) -> bool:
        """Create a manifest unless one exists under that key: ``True`` if this call created it.

        Exclusive and atomic: readers see no manifest or the whole of one, and of two concurrent calls
        exactly one returns ``True``.
        """
        ...

    def read_manifest(self, model: str, key: str) -> bytes | None: ...

    def delete_manifest(self, model: str, key: str) -> None: ...

    def list_models(self) -> list[str]: ...

    def list_manifest_keys(self, model: str) -> list[str]: ...

    def read_ref(self, model: str, channel: str) -> RefState | None: ...

    def write_ref(self, model: str, channel: str, key: str, expected: RefState | None) -> bool:
        """Point ``model:channel`` at ``key`` if the ref is still ``expected`` (``None``: still absent).

        Returns ``False``, changing nothing, when someone else moved it first.
        """
        ...

    def list_channels(self, model: str) -> list[str]: ...

    def create_stage(self, stage: str, key: str, body: bytes, files: Sequence[StageFile] = ()) -> bool:
        """Create a stage record (``stages/<stage>/<key>.json``: the files of one stage output, whose bytes are
        blobs, ``files``) unless one exists; exclusive and atomic as ``create_manifest``. Stage records are not
        artefacts: listings and resolution never see them. A store whose server collects its own garbage (OCI) makes
        the record reference ``files``' blobs; the others leave that to ``gc``, which reads the records."""
        ...

    def read_stage(self, stage: str, key: str) -> bytes | None: ...

    def list_stage_keys(self, stage: str) -> list[str]: ...

    def delete_stage(self, stage: str, key: str) -> None: ...

    def create_history(self, model: str, entry: str, body: bytes) -> bool:
        """Create a history record (``history/<model>/<entry>.json``: one cell run's outcome or one channel move,
        ``registry.history``) unless one exists; exclusive and atomic as ``create_manifest``. History records are
        append-only: nothing deletes them, and listings of artefacts and channels never see them."""
        ...

    def read_history(self, model: str, entry: str) -> bytes | None: ...

    def list_history(self, model: str) -> list[str]:
        """The entry names of ``model``'s history records, sorted."""
        ...

    def delete_stale_uploads(self, older_than_s: float, *, now: float | None = None) -> int:
        """Remove uploads that never completed (temp files, multipart uploads) idle for longer than this before
        ``now`` (default: the current time); returns how many."""
        ...

    def require_exists(self, where: str) -> None:
        """Raise ``NotFoundError`` naming ``where`` (the option or variable that gave the location) unless a registry
        is there, saying what "there" means for this kind of store: a command that reads a registry that does not
        exist must not read it as an empty one."""
        ...


_SCHEMES = r"s3|oci|oci\+http|file"
_MISSING_SLASHES = re.compile(rf"^({_SCHEMES}):(?!//)")  # s3:b/p, s3:/b/p
_MISSING_COLON = re.compile(rf"^({_SCHEMES})//")  # s3//b/p


def open_store(url: str, *, s3_endpoint: str | None = None, must_exist: bool = False,
               where: str = "--registry") -> RegistryStore:
    """The store for a registry URL: ``s3://bucket[/prefix]``, ``oci://host[:port]/namespace`` (``oci+http://`` for
    plain HTTP), a local directory (``file://`` optional), or a bundle file (``enginesmith bundle``: read-only).
    ``where`` names the option or variable that gave ``url``, in messages.

    Raises ``UserError`` for a URL it cannot use, and with ``must_exist`` (every command but those that create a
    registry: publish, copy's destination) ``NotFoundError`` for a registry that is not there.
    """
    store = _store_for(url, s3_endpoint, where)
    if must_exist:
        store.require_exists(where)
    return store


def _store_for(url: str, s3_endpoint: str | None, where: str) -> RegistryStore:
    if url.startswith("s3://"):
        from registry.s3 import S3Store

        return S3Store.from_url(url, endpoint_url=s3_endpoint, where=where)
    if url.startswith(("oci://", "oci+http://")):
        from registry.oci import OciStore

        return OciStore(url)
    _refuse_misspelt_scheme(url, where)
    if "://" in url and not url.startswith("file://"):
        scheme = url.split("://", 1)[0]
        raise UserError(f"unsupported registry scheme {scheme!r}", where=where,
                        hint="use a local directory, s3://bucket/prefix or oci://host[:port]/namespace")
    path = Path(url.removeprefix("file://"))
    if path.is_file():
        from registry.bundle import BundleStore

        return BundleStore(path)
    from registry.local import LocalStore

    parent = existing_ancestor(path)
    if not parent.is_dir():
        raise UserError(f"{path} cannot be a registry directory: {parent} is a file", where=where,
                        hint="choose a path whose parents are directories")
    return LocalStore(path)


def _refuse_misspelt_scheme(url: str, where: str) -> None:
    """A URL scheme short of its ``:`` or ``//`` (``s3:b/p``, ``s3:/b/p``, ``s3//b/p``) would otherwise name a local
    directory; one that exists may be named anything, a new one may not."""
    typo = _MISSING_SLASHES.match(url) or _MISSING_COLON.match(url)
    if typo is None or Path(url).is_dir():
        return
    scheme, rest = typo.group(1), url[typo.end():]
    meant = f"{scheme}://{rest if scheme == 'file' else rest.lstrip('/')}"
    missing = f"':' after its scheme {scheme}" if typo.re is _MISSING_COLON else f"'//' after its scheme {scheme}:"
    raise UserError(f"{url!r} has no {missing}", where=where,
                    hint=f"write {meant}, or ./{url} for a local directory of that name")
