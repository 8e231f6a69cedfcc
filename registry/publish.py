"""Publish an artefact directory: blobs first, then the manifest (the commit point), then the refs.

A crash before the manifest leaves only unreferenced blobs (invisible; ``gc`` removes them); a crash after it
leaves a complete artefact whose channels the next publish of the same key moves. Publishing a key that is
already there changes nothing but those channels: same key, same artefact.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from enginesmith import __version__
from enginesmith.core.artefacts import ARTEFACT_FILE, Artefact
from enginesmith.core.checkpoints.models import CheckpointFile
from enginesmith.core.errors import UserError
from registry.catalog import load_manifest
from registry.errors import IntegrityError, UnsafePathError
from registry.manifest import Manifest, SignatureRef, file_list_problem, key_problem, utc_timestamp
from registry.names import check_name
from registry.refs import RefChange, advance_channel
from registry.store import RegistryStore
from registry.transfer import RateLimiter, TransferProgress, file_chunks

if TYPE_CHECKING:
    from registry.signing import SigningKey

DEFAULT_CHANNELS = ("latest",)
DEFAULT_JOBS = 4


class PublishResult(BaseModel):
    model: str
    key: str
    registry: str
    created: bool  # False: this key was already published, and nothing but its channels changed
    files: int
    total_bytes: int
    uploaded_blobs: int
    uploaded_bytes: int  # sent by this publish
    resumed_bytes: int = 0  # of the uploaded blobs, stored already by an interrupted publish, so not sent again
    reused_blobs: int
    channels: list[RefChange]
    unlisted_files: list[str]  # in the directory but not in artefact.json, so not published
    signer: str | None = None  # the stored manifest's signing key fingerprint (None: unsigned)
    signature_covers: str | None = None


def read_artefact_dir(artefact_dir: Path) -> Artefact:
    """The ``artefact.json`` of a built artefact directory, with every listed path checked for safety.

    Raises ``UserError`` naming the file and field when it is missing or invalid, ``UnsafePathError`` for a
    path that leaves the directory.
    """
    if not artefact_dir.is_dir():
        raise UserError(f"{artefact_dir} is not a directory", where="ARTEFACT_DIR",
                        hint="give the directory the build stage wrote (it holds artefact.json)")
    record_path = artefact_dir / ARTEFACT_FILE
    try:
        artefact = Artefact.model_validate_json(record_path.read_bytes())
    except FileNotFoundError:
        raise UserError(f"no {ARTEFACT_FILE} in {artefact_dir}", where=str(artefact_dir),
                        hint="publish a directory written by `enginesmith build`") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(document)"
        raise UserError(f"{field}: {first['msg']}", where=str(record_path),
                        hint="artefact.json must match enginesmith.core.artefacts.Artefact; rebuild the "
                             "artefact") from None
    problem = file_list_problem(artefact.files)
    if problem and problem.escapes:
        raise UnsafePathError(problem.message, where=f"{record_path}: files[{problem.index}]",
                              hint="list each regular file inside the artefact directory once, by relative path")
    if problem:
        raise IntegrityError(problem.message, where=f"{record_path}: files[{problem.index}]",
                             hint="rebuild the artefact; the build stage records every file's size and sha256")
    check_name(artefact.lineage.model_id, "lineage.model_id")
    return artefact


def check_artefact_files(artefact_dir: Path, artefact: Artefact, *, jobs: int = DEFAULT_JOBS) -> None:
    """Every listed file is a regular file inside the directory with the listed size and sha256.

    Raises ``UnsafePathError`` for a symbolic link on the way to a file (its target is not what
    ``artefact.json`` describes) and ``IntegrityError`` naming the first file that differs.
    """
    def check(entry: CheckpointFile) -> None:
        path = _regular_file_inside(artefact_dir, entry.path)
        actual_size = path.stat().st_size
        if actual_size != entry.size:
            raise IntegrityError(f"{entry.path} has {actual_size} bytes; artefact.json says {entry.size}",
                                 where=str(path), hint="the directory changed after the build; rebuild the artefact")
        digest = hashlib.sha256()
        with path.open("rb", buffering=0) as handle:
            for chunk in file_chunks(handle):
                digest.update(chunk)
        if digest.hexdigest() != entry.sha256:
            raise IntegrityError(f"{entry.path} has sha256 {digest.hexdigest()}; artefact.json says {entry.sha256}",
                                 where=str(path), hint="the directory changed after the build; rebuild the artefact")

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(check, artefact.files))


def publish_artefact(
    store: RegistryStore,
    artefact_dir: Path,
    *,
    key: str | None = None,
    validation: dict[str, Any] | None = None,
    channels: Sequence[str] = DEFAULT_CHANNELS,
    jobs: int = DEFAULT_JOBS,
    limiter: RateLimiter | None = None,
    progress: TransferProgress | None = None,
    signing_key: SigningKey | None = None,
    signature: Path | None = None,
    statement_valid_for: timedelta | None = None,
) -> PublishResult:
    """Publish ``artefact_dir`` under ``key`` (default: the artefact's own key) and move ``channels`` to it.

    Uploads only the blobs the registry lacks, ``jobs`` at a time. With ``signing_key``, signs what a pull lays
    out (``registry.signing``) and stores the bundle as a blob the manifest names; with ``signature``, keeps a
    bundle made by model-signing's CLI over the directory. With ``signing_key``, each channel it moves gets a signed
    statement (``registry.channel_statements``; good for ``statement_valid_for``, default 7 days), and one it leaves
    where it is keeps its statement current. Raises ``UserError`` (and its subclasses) for a directory
    that does not match its ``artefact.json``, or a signature that is not over it, before anything is uploaded.
    """
    if signing_key is not None and signature is not None:
        raise UserError("give a signing key or a signature, not both", where="--signature",
                        hint="--sign-key signs at publish; --signature keeps a bundle made before")
    artefact = read_artefact_dir(artefact_dir)
    model = artefact.lineage.model_id
    key = check_name(key or (validation or {}).get("key") or artefact.key, "--key")
    problem = key_problem(key, artefact, validation)
    if problem:
        raise UserError(f"cannot publish under this key: {problem}", where="--key",
                        hint="publish under the artefact's key (the default), or with the validation report of this "
                             "artefact, whose key it then takes")
    for channel in channels:
        check_name(channel, "--channel")
    unlisted = [path for path in _unlisted_files(artefact_dir, artefact)
                if signature is None or artefact_dir / path != signature]  # a kept signature is not left out
    result = PublishResult(model=model, key=key, registry=store.location, created=False,
                           files=len(artefact.files), total_bytes=sum(f.size for f in artefact.files),
                           uploaded_blobs=0, uploaded_bytes=0, reused_blobs=0, channels=[], unlisted_files=unlisted)

    if store.read_manifest(model, key) is None:
        check_artefact_files(artefact_dir, artefact, jobs=jobs)
        manifest = Manifest(model=model, key=key, published=utc_timestamp(), published_by=__version__,
                            artefact=artefact, validation=validation)
        signed = _signature(manifest, signing_key, signature)
        first_file_of: dict[str, CheckpointFile] = {}
        for entry in artefact.files:
            first_file_of.setdefault(entry.sha256 or "", entry)
        with ThreadPoolExecutor(max(1, jobs)) as pool:
            present = dict(zip(first_file_of, pool.map(store.blob_size, first_file_of), strict=True))
            missing = [entry for digest, entry in first_file_of.items() if present[digest] != entry.size]

            def upload(entry: CheckpointFile) -> int:
                assert entry.sha256 is not None
                return store.put_blob(entry.sha256, artefact_dir / entry.path, limiter=limiter, progress=progress,
                                      name=entry.path)

            resumed_bytes = sum(pool.map(upload, missing))
        if signed is not None:
            reference, body = signed
            _put_small_blob(store, reference.sha256, body)
            manifest = manifest.with_signature(reference)
        result.created = store.create_manifest(model, key, manifest.to_bytes())
        result.uploaded_blobs = len(missing)
        result.uploaded_bytes = sum(entry.size for entry in missing) - resumed_bytes
        result.resumed_bytes = resumed_bytes
        result.reused_blobs = len(first_file_of) - len(missing)
    # Whoever created it (this call, an earlier one, a concurrent one), the stored manifest is the truth.
    stored = load_manifest(store, model, key)
    if stored.signature is not None:
        result.signer, result.signature_covers = stored.signature.signer, stored.signature.covers
    signer = None
    if signing_key is not None:
        from registry.channel_statements import DEFAULT_VALID_FOR, ChannelSigner

        signer = ChannelSigner(store, signing_key, statement_valid_for or DEFAULT_VALID_FOR)
    result.channels = [advance_channel(store, stored, channel, signer=signer) for channel in channels]
    return result


def _signature(manifest: Manifest, signing_key: SigningKey | None,
               signature: Path | None) -> tuple[SignatureRef, bytes] | None:
    """The signature to store with ``manifest``, made with ``signing_key`` or read from ``signature`` and checked to
    be over this artefact; ``None`` for neither."""
    if signing_key is None and signature is None:
        return None
    from registry.signing import MAX_SIGNATURE_BYTES, SIGNED_AT_PUBLISH, adopt_signature, sign_manifest

    if signing_key is not None:
        body = sign_manifest(manifest, signing_key)
        return SignatureRef(sha256=hashlib.sha256(body).hexdigest(), size=len(body), signer=signing_key.fingerprint,
                            covers=SIGNED_AT_PUBLISH), body
    assert signature is not None
    if not signature.is_file() or signature.stat().st_size > MAX_SIGNATURE_BYTES:
        raise UserError(f"{signature} is not a signature bundle file", where="--signature",
                        hint="give the file model_signing sign wrote (--signature PATH)")
    body = signature.read_bytes()
    return adopt_signature(body, manifest, where=str(signature)), body


def _put_small_blob(store: RegistryStore, digest: str, body: bytes) -> None:
    if store.blob_size(digest) == len(body):
        return
    with tempfile.TemporaryDirectory(prefix="enginesmith-publish-") as scratch:
        path = Path(scratch) / "blob"
        path.write_bytes(body)
        store.put_blob(digest, path)


def _regular_file_inside(artefact_dir: Path, relative: str) -> Path:
    path = artefact_dir
    for part in relative.split("/"):
        path = path / part
        if path.is_symlink():
            raise UnsafePathError(f"{relative} is (or lies under) a symbolic link: {path} → {path.readlink()}",
                                  where=str(artefact_dir / ARTEFACT_FILE),
                                  hint="artefacts hold regular files only; copy the target into the directory")
    if not path.is_file():
        raise IntegrityError(f"{relative} is listed in artefact.json but is not a file in the directory",
                             where=str(path), hint="the directory is incomplete; rebuild the artefact")
    return path


def _unlisted_files(artefact_dir: Path, artefact: Artefact) -> list[str]:
    listed = {f.path for f in artefact.files} | {ARTEFACT_FILE}
    found = (str(p.relative_to(artefact_dir)) for p in artefact_dir.rglob("*") if p.is_file() or p.is_symlink())
    return sorted(p for p in found if p not in listed)
