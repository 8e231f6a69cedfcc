"""Bundles: artefacts in one file for air-gapped transfer, and a read-only store over such a file.

A bundle is an uncompressed tar (engines barely compress) holding the registry layout itself:
``enginesmith-bundle.json`` (an index: which artefacts, which channels), ``manifests/<model>/<key>.json``
byte for byte as stored, ``blobs/sha256/<hex>`` once each, and the signed records of each model's channels and
builds (``history/<model>/statement-…`` and ``withdrawal-…``: an air-gapped node checks them as a registry's).
``BundleStore`` reads it in place (no extraction: member names are only looked up, never used as paths), so
``pull --from-bundle`` is the same verified pull as from a registry.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tarfile
import time
import uuid
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path

from pydantic import BaseModel, ValidationError

from enginesmith.core.errors import UserError
from registry.errors import IntegrityError, NotFoundError, ReadOnlyStoreError
from registry.history import STATEMENT_ENTRY_PREFIX, WITHDRAWAL_ENTRY_PREFIX
from registry.manifest import Manifest, utc_timestamp
from registry.names import MANIFEST_SUFFIX, blob_path, history_dir, history_path, is_digest, is_name, manifest_path
from registry.store import BlobInfo, RefState, RegistryStore, StageFile
from registry.transfer import LOCAL_CHUNK_BYTES, RateLimiter, TransferProgress, owned_chunks

INDEX_MEMBER = "enginesmith-bundle.json"
SIGNED_RECORD_PREFIXES = (STATEMENT_ENTRY_PREFIX, WITHDRAWAL_ENTRY_PREFIX)
BUNDLE_SCHEMA_VERSION = 1


class BundledArtefact(BaseModel):
    model: str
    key: str


class BundleIndex(BaseModel):
    schema_version: int = BUNDLE_SCHEMA_VERSION
    created: str
    artefacts: list[BundledArtefact]
    refs: dict[str, str] = {}  # "model:channel" → key, for the channels named when bundling
    registry: str | None = None  # the identity of the registry it was made from (None: an older bundle)


class BundleResult(BaseModel):
    out: str
    artefacts: list[str]  # model@key
    refs: dict[str, str]
    blobs: int
    bytes: int
    signed_records: int = 0  # channel statements and withdrawals carried


def write_bundle(
    store: RegistryStore,
    manifests: list[Manifest],
    out: Path,
    *,
    refs: dict[str, str] | None = None,
    progress: TransferProgress | None = None,
) -> BundleResult:
    """Write ``manifests`` and their blobs (each verified against its sha256 on the way) to ``out``.

    The file appears only when complete. Raises ``IntegrityError`` naming a file whose stored bytes do not
    match its sha256.
    """
    unique = {m.ref: m for m in manifests}
    index = BundleIndex(created=utc_timestamp(), refs=refs or {}, registry=store.identity,
                        artefacts=[BundledArtefact(model=m.model, key=m.key) for m in unique.values()])
    blobs: dict[str, tuple[int, str]] = {}
    for manifest in unique.values():
        for digest, entries in manifest.files_by_digest().items():
            blobs.setdefault(digest, (entries[0].size, entries[0].path))
        if manifest.signature is not None:
            blobs.setdefault(manifest.signature.sha256, (manifest.signature.size, f"{manifest.ref} signature"))
    out.parent.mkdir(parents=True, exist_ok=True)
    temp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:12]}.partial")
    try:
        with tarfile.TarFile(temp, "w", format=tarfile.PAX_FORMAT, copybufsize=LOCAL_CHUNK_BYTES) as tar:
            _add_bytes(tar, INDEX_MEMBER, index.model_dump_json(indent=2).encode())
            for manifest in unique.values():
                body = store.read_manifest(manifest.model, manifest.key)
                assert body is not None  # it was just loaded
                _add_bytes(tar, manifest_path(manifest.model, manifest.key), body)
            signed_records = 0
            for model in sorted({m.model for m in unique.values()}):
                for entry in store.list_history(model):
                    record = store.read_history(model, entry) if entry.startswith(SIGNED_RECORD_PREFIXES) else None
                    if record is not None:
                        _add_bytes(tar, history_path(model, entry), record)
                        signed_records += 1
            for digest, (size, path) in blobs.items():
                if progress is not None:
                    progress.started(path, size, 0)
                with contextlib.closing(store.read_blob(digest)) as chunks:
                    reader = _VerifyingReader(chunks, progress, path)
                    info = tarfile.TarInfo(blob_path(digest))
                    info.size, info.mode, info.mtime = size, 0o444, int(time.time())
                    try:
                        tar.addfile(info, reader)
                    except (OSError, tarfile.TarError):
                        raise IntegrityError(f"{path}: the registry holds fewer than {size} bytes for it",
                                             where=store.location, hint="re-publish the artefact") from None
                handed_over, left_over = reader.finish()
                if handed_over != digest or left_over:
                    raise IntegrityError(f"{path}: the registry's bytes do not match sha256 {digest}",
                                         where=store.location, hint="re-publish the artefact")
                if progress is not None:
                    progress.finished(path)
        os.replace(temp, out)
    finally:
        temp.unlink(missing_ok=True)
    return BundleResult(out=str(out), artefacts=list(unique), refs=index.refs, blobs=len(blobs),
                        bytes=sum(size for size, _ in blobs.values()), signed_records=signed_records)


class BundleStore:
    """A bundle file, read in place as a read-only registry."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._members: dict[str, tuple[int, int, float]] = {}  # name → (data offset, size, mtime)
        try:
            with tarfile.open(path, "r:") as tar:
                for member in tar:
                    if member.isfile():
                        self._members[member.name] = (member.offset_data, member.size, float(member.mtime))
        except FileNotFoundError:
            raise UserError(f"{path} does not exist", where="--from-bundle") from None
        except tarfile.TarError as exc:
            raise UserError(f"{path} is not an enginesmith bundle ({exc})", where="--from-bundle",
                            hint="make one with `enginesmith bundle REF… --out FILE`") from None
        try:
            self.index = BundleIndex.model_validate_json(self._read_member(INDEX_MEMBER))
        except (KeyError, ValidationError):
            raise UserError(f"{path} has no valid {INDEX_MEMBER}", where="--from-bundle",
                            hint="make bundles with `enginesmith bundle REF… --out FILE`") from None

    @property
    def location(self) -> str:
        return f"bundle {self.path}"

    @property
    def identity(self) -> str:
        # A bundle's channel statements name the registry it was made from, and a node's memory of that registry's
        # channels holds for what the bundle carries as well.
        return self.index.registry or f"bundle://{self.path.resolve()}"

    @property
    def shares_namespace(self) -> bool:
        return False

    def blob_size(self, digest: str) -> int | None:
        member = self._members.get(blob_path(digest))
        return None if member is None else member[1]

    def put_blob(self, digest: str, source: Path, *, limiter: RateLimiter | None = None,
                 progress: TransferProgress | None = None, name: str = "") -> int:
        raise ReadOnlyStoreError("a bundle cannot be written", where=self.location)

    def read_blob(self, digest: str, offset: int = 0) -> Generator[bytes, None, None]:
        member = self._members.get(blob_path(digest))
        if member is None:
            raise NotFoundError(f"blob sha256:{digest} is not in the bundle", where=self.location,
                                hint="bundle the artefact again")
        data_offset, size, _ = member
        with self.path.open("rb", buffering=0) as handle:
            handle.seek(data_offset + offset)
            yield from owned_chunks(handle, limit=max(0, size - offset))

    def list_blobs(self) -> Generator[BlobInfo, None, None]:
        for name, (_, size, mtime) in self._members.items():
            digest = name.rsplit("/", 1)[-1]
            if is_digest(digest) and name == blob_path(digest):
                yield BlobInfo(digest=digest, size=size, modified=mtime)

    def delete_blob(self, digest: str) -> None:
        raise ReadOnlyStoreError("a bundle cannot be changed", where=self.location)

    def create_manifest(self, model: str, key: str, body: bytes) -> bool:
        raise ReadOnlyStoreError("a bundle cannot be written", where=self.location)

    def read_manifest(self, model: str, key: str) -> bytes | None:
        try:
            return self._read_member(manifest_path(model, key))
        except KeyError:
            return None

    def delete_manifest(self, model: str, key: str) -> None:
        raise ReadOnlyStoreError("a bundle cannot be changed", where=self.location)

    def list_models(self) -> list[str]:
        return sorted({parts[1] for parts in self._manifest_names() if is_name(parts[1])})

    def list_manifest_keys(self, model: str) -> list[str]:
        keys = (parts[2].removesuffix(MANIFEST_SUFFIX) for parts in self._manifest_names() if parts[1] == model)
        return sorted(k for k in keys if is_name(k))

    def read_ref(self, model: str, channel: str) -> RefState | None:
        key = self.index.refs.get(f"{model}:{channel}")
        return None if key is None else RefState(key=key, version=key)

    def write_ref(self, model: str, channel: str, key: str, expected: RefState | None) -> bool:
        raise ReadOnlyStoreError("a bundle cannot be changed", where=self.location)

    def list_channels(self, model: str) -> list[str]:
        return sorted(ref.split(":", 1)[1] for ref in self.index.refs if ref.split(":", 1)[0] == model)

    def delete_stale_uploads(self, older_than_s: float, *, now: float | None = None) -> int:
        return 0

    # A bundle carries artefacts, not the handoffs between the nodes that built them.
    def require_exists(self, where: str) -> None:
        pass  # read when opened: a bundle that is not there was refused then

    def create_stage(self, stage: str, key: str, body: bytes, files: Sequence[StageFile] = ()) -> bool:
        raise ReadOnlyStoreError("a bundle cannot be changed", where=self.location)

    def read_stage(self, stage: str, key: str) -> bytes | None:
        return None

    def list_stage_keys(self, stage: str) -> list[str]:
        return []

    def delete_stage(self, stage: str, key: str) -> None:
        raise ReadOnlyStoreError("a bundle cannot be changed", where=self.location)

    # Of the build history of the registry it came from, only the signed records: a bundle is never recorded in.
    def create_history(self, model: str, entry: str, body: bytes) -> bool:
        raise ReadOnlyStoreError("a bundle cannot be changed", where=self.location,
                                 hint="record history in the registry the artefact was published to")

    def read_history(self, model: str, entry: str) -> bytes | None:
        try:
            return self._read_member(history_path(model, entry))
        except KeyError:
            return None

    def list_history(self, model: str) -> list[str]:
        prefix = f"{history_dir(model)}/"
        return sorted(name[len(prefix):].removesuffix(MANIFEST_SUFFIX) for name in self._members
                      if name.startswith(prefix) and name.endswith(MANIFEST_SUFFIX))

    def _read_member(self, name: str) -> bytes:
        data_offset, size, _ = self._members[name]
        with self.path.open("rb") as handle:
            handle.seek(data_offset)
            return handle.read(size)

    def _manifest_names(self) -> Iterator[list[str]]:
        for name in self._members:
            parts = name.split("/")
            if len(parts) == 3 and parts[0] == "manifests" and parts[2].endswith(MANIFEST_SUFFIX):
                yield parts


def bundle_manifests(store: RegistryStore, refs: list[str]) -> tuple[list[Manifest], dict[str, str]]:
    """The manifests that ``MODEL``, ``MODEL@KEY`` and ``MODEL:CHANNEL`` references name (a bare model: all of
    its artefacts), and the channels among them as ``{"model:channel": key}``."""
    from registry.catalog import find_manifest, list_model
    from registry.names import parse_ref

    manifests: list[Manifest] = []
    channels: dict[str, str] = {}
    for text in refs:
        ref = parse_ref(text)
        if ref.names_one_manifest:
            manifest = find_manifest(store, ref)
            manifests.append(manifest)
            if ref.channel is not None:
                channels[str(ref)] = manifest.key
        else:
            listing = list_model(store, ref.model)
            if not listing.manifests:
                raise NotFoundError(f"no artefacts of {ref.model}", where=store.location,
                                    hint="`enginesmith ls` lists the models")
            manifests += listing.manifests
            channels |= {f"{ref.model}:{c}": k for c, k in listing.channels.items()}
    return manifests, channels


def _add_bytes(tar: tarfile.TarFile, name: str, body: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(body), 0o444, int(time.time())
    tar.addfile(info, io.BytesIO(body))


class _VerifyingReader:
    """A file-like view of a blob's chunks for ``tarfile``, hashing what it hands over."""

    def __init__(self, chunks: Iterator[bytes], progress: TransferProgress | None, name: str) -> None:
        self._chunks = chunks
        self._pending = memoryview(b"")
        self._digest = hashlib.sha256()
        self._progress = progress
        self._name = name

    def read(self, size: int = -1) -> bytes:
        """Exactly ``size`` bytes (all that is left when negative), fewer only at the end: tarfile takes a short
        read for the end of the data."""
        parts: list[bytes] = []
        wanted = size if size >= 0 else None
        got = 0
        while wanted is None or got < wanted:
            if not self._pending:
                chunk = next(self._chunks, None)
                if chunk is None:
                    break
                self._pending = memoryview(chunk)
            take = self._pending if wanted is None else self._pending[: wanted - got]
            self._pending = self._pending[len(take):]
            self._digest.update(take)
            parts.append(bytes(take))
            got += len(take)
        if self._progress is not None and got:
            self._progress.advanced(self._name, got)
        return b"".join(parts)

    def finish(self) -> tuple[str, bool]:
        """The sha256 of what was handed over, and whether the source had bytes left after it."""
        left_over = bool(self._pending) or next(self._chunks, None) is not None
        return self._digest.hexdigest(), left_over
