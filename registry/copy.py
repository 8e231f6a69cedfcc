"""Copying artefacts between registries as they are (as ``crane copy`` and ``oras copy`` copy images): a staging
registry promotes into production, a mirror behind an air gap verifies with the same trust file.

What is copied, in this order so that a reader of the destination never meets a record whose parts are missing:
the blobs each manifest names (files and signature; fetched through the blob cache, resumed and verified against
their sha256, then put, resumed as a publish is), the manifests byte for byte (dates, signatures and reports
unchanged), the history records of the model (cell outcomes, channel moves, withdrawals), and last the channels,
each set to the key it has in the source. What the destination holds already is left as it is, so a copy killed
anywhere is continued by running it again.

Channel statements are not copied, and nothing is signed again: a statement names the registry it was made in, so
the source's would vouch for nothing in the destination (and, with their higher sequences, would bury the
destination's own). A channel the destination has statements for is its promoters' to move (``promote --sign-key``
there), so the copy leaves it where it is; one it has none for is moved, and the result says that the source's
statements stayed behind.
"""

from __future__ import annotations

from pydantic import BaseModel

from enginesmith.core.checkpoints.models import CheckpointFile
from registry.cache import BlobCache
from registry.catalog import list_model
from registry.channel_statements import statement_sequences
from registry.errors import IntegrityError
from registry.history import STATEMENT_ENTRY_PREFIX
from registry.manifest import Manifest
from registry.pull import fetch_files
from registry.store import RegistryStore
from registry.transfer import RateLimiter


class CopiedChannel(BaseModel):
    model: str
    channel: str
    key: str
    moved: bool
    why_not: str = ""
    note: str = ""  # about a channel moved: the source's statements that stayed behind


class CopyResult(BaseModel):
    source: str
    destination: str
    artefacts: list[str] = []  # model@key created in the destination
    present: list[str] = []  # model@key the destination had already
    blobs_copied: int = 0
    bytes_copied: int = 0  # sent to the destination
    resumed_bytes: int = 0  # of the blobs copied, what an interrupted copy had left in the destination: not sent again
    history_records: int = 0
    channels: list[CopiedChannel] = []


def copy_artefacts(source: RegistryStore, destination: RegistryStore, manifests: list[Manifest],
                   channels: dict[str, str], cache: BlobCache, *, jobs: int = 4,
                   limiter: RateLimiter | None = None) -> CopyResult:
    """Copy ``manifests`` (and their models' history) from ``source`` to ``destination``, then point each of
    ``channels`` (``{"model:channel": key}``, as the source has them) at the same key; ``limiter`` holds both the
    reads from the source and the writes to the destination. Raises ``IntegrityError`` for a destination that holds
    another manifest under one of the keys."""
    result = CopyResult(source=source.location, destination=destination.location)
    unique = {m.ref: m for m in manifests}
    for manifest in unique.values():
        body = source.read_manifest(manifest.model, manifest.key)
        assert body is not None  # it was just listed
        there = destination.read_manifest(manifest.model, manifest.key)
        if there is None:  # a manifest goes in after its blobs, so one that is there has them
            _copy_blobs(source, destination, manifest, cache, jobs, limiter, result)
        if there is None and destination.create_manifest(manifest.model, manifest.key, body):
            result.artefacts.append(manifest.ref)
        elif (there or destination.read_manifest(manifest.model, manifest.key)) != body:
            raise IntegrityError(f"{destination.location} holds another manifest under {manifest.ref}",
                                 where=destination.location,
                                 hint="the two registries published different artefacts under one key; copy "
                                      "into another registry, or remove that manifest there first")
        else:
            result.present.append(manifest.ref)
    for model in sorted({m.model for m in unique.values()}):
        result.history_records += _copy_history(source, destination, model)
    for name, key in sorted(channels.items()):
        model, channel = name.split(":", 1)
        result.channels.append(_copy_channel(source, destination, model, channel, key))
    return result


def _copy_blobs(source: RegistryStore, destination: RegistryStore, manifest: Manifest, cache: BlobCache, jobs: int,
                limiter: RateLimiter | None, result: CopyResult) -> None:
    wanted = [CheckpointFile(path=entries[0].path, size=entries[0].size, sha256=digest)
              for digest, entries in manifest.files_by_digest().items()]
    if manifest.signature is not None:
        wanted.append(CheckpointFile(path="signature", size=manifest.signature.size, sha256=manifest.signature.sha256))
    missing = [f for f in wanted if destination.blob_size(f.sha256 or "") != f.size]
    fetch_files(source, missing, cache, what=f"copying {manifest.ref}", jobs=jobs, limiter=limiter)
    for entry in missing:
        assert entry.sha256 is not None
        kept = destination.put_blob(entry.sha256, cache.blob(entry.sha256), limiter=limiter, name=entry.path)
        if destination.blob_size(entry.sha256) != entry.size:  # verified on arrival, as the destination holds it
            raise IntegrityError(f"{entry.path} ({entry.sha256[:12]}) did not arrive whole", where=destination.location,
                                 hint="run the same copy again")
        result.blobs_copied += 1
        result.bytes_copied += entry.size - kept
        result.resumed_bytes += kept


def _copy_history(source: RegistryStore, destination: RegistryStore, model: str) -> int:
    present = set(destination.list_history(model))
    copied = 0
    for entry in source.list_history(model):
        if entry in present or entry.startswith(STATEMENT_ENTRY_PREFIX):
            continue
        body = source.read_history(model, entry)
        if body is not None and destination.create_history(model, entry, body):
            copied += 1
    return copied


def _copy_channel(source: RegistryStore, destination: RegistryStore, model: str, channel: str,
                  key: str) -> CopiedChannel:
    vouch = (f"enginesmith promote {model}@{key} --channel {channel} --sign-key KEY --registry "
             f"{destination.location}")
    current = destination.read_ref(model, channel)
    if current is not None and current.key == key:
        return CopiedChannel(model=model, channel=channel, key=key, moved=False, why_not="already there")
    if statement_sequences(destination, model, channel):
        return CopiedChannel(model=model, channel=channel, key=key, moved=False,
                             why_not="the destination has its own signed statements for it, which a copy does not "
                                     f"move past; to vouch for this build there: {vouch}")
    if not destination.write_ref(model, channel, key, expected=current):
        return CopiedChannel(model=model, channel=channel, key=key, moved=False,
                             why_not="it moved in the destination while this copy ran")
    note = (f"its signed statements name {source.location} and were not copied; to vouch for it there: {vouch}"
            if statement_sequences(source, model, channel) else "")
    return CopiedChannel(model=model, channel=channel, key=key, moved=True, note=note)


def copy_selection(source: RegistryStore, refs: list[str]) -> tuple[list[Manifest], dict[str, str]]:
    """What ``refs`` name in ``source`` (``registry.bundle.bundle_manifests``), or every model's artefacts and
    channels when none is given."""
    from registry.bundle import bundle_manifests

    if refs:
        return bundle_manifests(source, refs)
    manifests: list[Manifest] = []
    channels: dict[str, str] = {}
    for model in source.list_models():
        listing = list_model(source, model)
        manifests += listing.manifests
        channels |= {f"{model}:{c}": k for c, k in listing.channels.items()}
    return manifests, channels
