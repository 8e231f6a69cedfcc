"""Garbage collection: old manifests by a retention rule, then blobs that no manifest references.

Retention: per cell (model, recipe, kind, target, tp, pp) keep the newest ``keep_last`` manifests, and every
manifest a ref points at. Manifests go before blobs, so no reader ever sees a manifest whose blobs are gone.

"Newest" is by the publication time a signature covers, not the manifest's field as stored (any writer of the
storage can rewrite that: a new build dated 1999 would be collected before the oldest). In a cell where some build's
time is signed, a build whose time is not (unsigned, signed before signatures covered the time, or a field that is
not the one its signature covers; with a trust list, not signed by a trusted key) leaves the cell's order unknown:
gc keeps that cell whole and names the build (``GcResult.unordered``) rather than guess. Without a trust list, a cell
where nothing is signed is ordered by the field, as nothing there could say otherwise; with one, every build of a cell
gc would thin must have a trusted signed time.
An unreferenced blob younger than the grace period is kept: a publish may have uploaded it and not yet
written its manifest. So is an unfinished upload that stored something within the grace period: a publish may
still be sending it, or a killed one continue it.

Stage records (a quantised checkpoint handed between nodes, ``registry.stages``) are handoffs, not artefacts:
one is kept, with its blobs, for ``stage_ttl_s`` after it was stashed, then deleted like an unreferenced blob.

History records (``history/<model>/``, ``registry.history``) are never read or deleted here: they reference no
blobs, they are small, and they are the only record of runs that failed and of who moved a channel.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterable

from pydantic import BaseModel

from registry.catalog import channel_keys, list_model
from registry.errors import IntegrityError, SignatureError
from registry.manifest import PUBLICATION_FILE, Manifest, believable_time, parse_timestamp
from registry.signing import (
    SIGNED_AT_PUBLISH,
    Trust,
    check_signature,
    publication_record_bytes,
    read_bundle,
    read_signature,
)
from registry.store import RegistryStore

DEFAULT_KEEP_LAST = 3
DEFAULT_GRACE_S = 3600.0
DEFAULT_STAGE_TTL_S = 7 * 86400.0


class GcResult(BaseModel):
    registry: str
    dry_run: bool
    keep_last: int
    kept_manifests: int
    deleted_manifests: list[str]  # model@key
    deleted_blobs: int
    deleted_bytes: int
    referenced_blobs: int
    young_unreferenced_blobs: int  # unreferenced, but within the grace period
    stale_uploads_removed: int
    kept_stage_records: int = 0
    deleted_stage_records: list[str] = []  # stage/key
    skipped_foreign: list[str] = []  # model:tag of records another tool wrote beside ours (OCI): never touched
    unordered: dict[str, str] = {}  # model@key → why its publication time is not signed: its cell was kept whole


def manifests_to_delete(manifests: Iterable[Manifest], pinned: set[tuple[str, str]], keep_last: int,
                        unsigned_time: Callable[[Manifest], str | None] = lambda _: None, *,
                        signed_only: bool = False) -> tuple[list[Manifest], dict[str, str]]:
    """The manifests the retention rule drops: beyond the newest ``keep_last`` of their cell, and not pinned
    (``(model, key)`` pairs a ref points at); and the builds (``model@key`` → ``unsigned_time``'s reason) whose
    publication time is not signed in a cell of more than ``keep_last`` where others' are (or, ``signed_only``, in any
    such cell): that cell drops none."""
    by_cell: dict[tuple[str, str, str, str, int, int], list[Manifest]] = defaultdict(list)
    for manifest in manifests:
        by_cell[manifest.cell].append(manifest)
    doomed: list[Manifest] = []
    unordered: dict[str, str] = {}
    for cell_manifests in by_cell.values():
        if len(cell_manifests) <= keep_last:
            continue
        unsigned = {m.ref: why for m in cell_manifests if (why := unsigned_time(m)) is not None}
        if unsigned and (signed_only or len(unsigned) < len(cell_manifests)):
            unordered |= unsigned
            continue
        newest_first = sorted(cell_manifests, key=lambda m: (believable_time(m.published), m.key), reverse=True)
        doomed += [m for m in newest_first[keep_last:] if (m.model, m.key) not in pinned]
    return doomed, unordered


def unsigned_time(store: RegistryStore, manifest: Manifest, trust: Trust | None) -> str | None:
    """Why ``manifest``'s publication time is not one its signature covers (with ``trust``: a trusted key's
    signature), or ``None`` when it is."""
    if manifest.signature is None:
        return "not signed"
    if manifest.signature.covers != SIGNED_AT_PUBLISH:
        return "its signature does not cover the publication time"
    where = f"{store.location}: {manifest.ref}"
    try:
        body = read_signature(store, manifest)
        if trust is not None:
            check_signature(manifest, body, trust, where=where)
            return None
        assert body is not None
        signed = read_bundle(body, where)[1].digests.get(PUBLICATION_FILE)
    except SignatureError as refused:
        return refused.message
    if signed != hashlib.sha256(publication_record_bytes(manifest)).hexdigest():
        return f"its publication time ({manifest.published}) is not the one its signature covers"
    return None


def collect_garbage(
    store: RegistryStore,
    *,
    keep_last: int = DEFAULT_KEEP_LAST,
    grace_s: float = DEFAULT_GRACE_S,
    dry_run: bool = False,
    now: float | None = None,
    stage_ttl_s: float = DEFAULT_STAGE_TTL_S,
    trust: Trust | None = None,
) -> GcResult:
    """Apply the retention rule, then delete unreferenced blobs older than ``grace_s`` and stale uploads. With
    ``trust``, only a trusted key's signature makes a publication time signed (see the module's docstring).

    Raises ``IntegrityError`` (deleting nothing) if any manifest cannot be read: its blobs would look
    unreferenced.
    """
    if keep_last < 1:
        raise ValueError("keep_last must be at least 1")
    now = time.time() if now is None else now
    manifests: list[Manifest] = []
    foreign: list[str] = []
    pinned: set[tuple[str, str]] = set()
    for model in store.list_models():
        listing = list_model(store, model)
        if listing.unreadable:
            first = listing.unreadable[0]
            raise IntegrityError(
                f"{len(listing.unreadable)} manifest(s) of {model} cannot be read, e.g. {first.key}: {first.problem}",
                where=store.location, hint="gc must know every blob a manifest references; fix or delete them first",
            )
        manifests += listing.manifests
        foreign += [f"{model}:{record.key}" for record in listing.foreign]
        pinned |= {(model, key) for key in listing.channels.values()}
    doomed, unordered = manifests_to_delete(manifests, pinned, keep_last, lambda m: unsigned_time(store, m, trust),
                                            signed_only=trust is not None)
    doomed_refs = {m.ref for m in doomed}
    referenced = {digest for m in manifests if m.ref not in doomed_refs for digest in m.blob_digests()}
    kept_stages, expired_stages = stage_records(store, older_than=now - stage_ttl_s)
    referenced |= {digest for record in kept_stages for digest in record.digests}
    unreferenced = [b for b in store.list_blobs() if b.digest not in referenced]
    expired = [b for b in unreferenced if b.modified < now - grace_s]
    stale_uploads = 0
    if not dry_run:
        spared = _now_on_a_channel(store, doomed)
        if spared:  # promoted since the listing: kept, with their blobs
            doomed = [m for m in doomed if m.ref not in spared]
            doomed_refs -= {m.ref for m in spared.values()}
            referenced |= {digest for m in spared.values() for digest in m.blob_digests()}
            expired = [b for b in expired if b.digest not in referenced]
            unreferenced = [b for b in unreferenced if b.digest not in referenced]
        for manifest in doomed:
            store.delete_manifest(manifest.model, manifest.key)
        for record in expired_stages:
            store.delete_stage(record.stage, record.key)
        for blob in expired:
            store.delete_blob(blob.digest)
        stale_uploads = store.delete_stale_uploads(grace_s, now=now)
    return GcResult(
        registry=store.location, dry_run=dry_run, keep_last=keep_last, kept_manifests=len(manifests) - len(doomed),
        deleted_manifests=sorted(doomed_refs), deleted_blobs=len(expired), deleted_bytes=sum(b.size for b in expired),
        referenced_blobs=len(referenced), young_unreferenced_blobs=len(unreferenced) - len(expired),
        stale_uploads_removed=stale_uploads, kept_stage_records=len(kept_stages),
        deleted_stage_records=sorted(f"{r.stage}/{r.key}" for r in expired_stages), skipped_foreign=foreign,
        unordered=unordered,
    )


def _now_on_a_channel(store: RegistryStore, doomed: list[Manifest]) -> dict[str, Manifest]:
    """Of ``doomed``, those a channel points at now (by ref): a promote between gc's listing and its deletes would
    otherwise leave a channel naming a deleted artefact (and on OCI, where a delete takes every tag on the manifest
    with it, no channel at all)."""
    by_model: dict[str, set[str]] = {}
    spared = {}
    for manifest in doomed:
        if manifest.model not in by_model:
            by_model[manifest.model] = set(channel_keys(store, manifest.model).values())
        if manifest.key in by_model[manifest.model]:
            spared[manifest.ref] = manifest
    return spared


class StageRecordRef(BaseModel):
    stage: str
    key: str
    digests: set[str]


def stage_records(store: RegistryStore, *, older_than: float) -> tuple[list[StageRecordRef], list[StageRecordRef]]:
    """The stage records to keep (stashed at or after ``older_than``, a Unix time) and those to delete: older, or
    unreadable (a handoff nobody can use; its blobs go when unreferenced)."""
    from registry.stages import QUANTIZED_STAGE, read_stashed

    kept: list[StageRecordRef] = []
    expired: list[StageRecordRef] = []
    for key in store.list_stage_keys(QUANTIZED_STAGE):
        try:
            record = read_stashed(store, key)
            stashed = parse_timestamp(record.stashed).timestamp() if record else None
        except (IntegrityError, ValueError):
            record = stashed = None
        if record is None or stashed is None:  # unreadable, or deleted since the listing
            expired.append(StageRecordRef(stage=QUANTIZED_STAGE, key=key, digests=set()))
            continue
        ref = StageRecordRef(stage=QUANTIZED_STAGE, key=key,
                             digests={f.sha256 for f in record.quantized.files if f.sha256})
        (kept if stashed >= older_than else expired).append(ref)
    return kept, expired


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``1h``, ``2d`` → seconds; raises ``ValueError`` with what to write instead."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    cleaned = text.strip().lower()
    unit = cleaned[-1:] if cleaned[-1:] in units else "s"
    number = cleaned[:-1] if cleaned[-1:] in units else cleaned
    try:
        seconds = float(number) * units[unit]
    except ValueError:
        raise ValueError(f"{text!r} is not a duration; write e.g. 0, 90s, 30m, 1h or 2d") from None
    if seconds < 0:
        raise ValueError(f"{text!r}: a duration cannot be negative")
    return seconds
