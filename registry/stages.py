"""A quantised checkpoint handed from the node that quantised it to the node that builds from it.

Quantising a model can need a bigger node than building or serving it (70B calibrates in BF16 across eight
GPUs; its fp8 engine runs on four), so the config may name another work pool for the quantize stage
(``quantize_pools``). That node stashes its output in the registry: every file as a blob, then a stage record
``stages/quantized/<quantize key>.json`` written once, last (the commit point, as a manifest is for an
artefact). The building node fetches it into its work directory through the pull cache, each blob verified.
Stage records are not artefacts: ``list``, ``resolve`` and ``pull`` never see them.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ValidationError

from enginesmith.core.artefacts import COMPLETE_MARKER, METADATA_FILE, QuantizedCheckpoint
from enginesmith.core.diskspace import same_filesystem
from enginesmith.core.staging import staged_output
from registry.cache import BlobCache, link_or_copy
from registry.errors import IntegrityError
from registry.manifest import utc_timestamp
from registry.pull import fetch_files
from registry.store import RegistryStore, StageFile

QUANTIZED_STAGE = "quantized"


class StashedQuantized(BaseModel):
    """The stage record: the quantize stage's own metadata (its files' sizes and sha256), and where it ran."""

    schema_version: Literal[1] = 1
    quantized: QuantizedCheckpoint
    node: str
    stashed: str  # ISO 8601, UTC


class StashResult(BaseModel):
    key: str
    registry: str
    created: bool  # False: this key was stashed already (by an earlier run), and nothing changed
    uploaded_blobs: int
    reused_blobs: int


def stash_quantized(store: RegistryStore, quantized: QuantizedCheckpoint) -> StashResult:
    """Upload a finished quantize output's files, then its record. Raises ``IntegrityError`` naming a file whose
    bytes changed since the stage listed them (the blob store hashes as it copies)."""
    source = Path(quantized.out_dir)
    if not (source / COMPLETE_MARKER).is_file():
        raise IntegrityError(f"{source} is not a finished quantize output (no completion marker)", where=str(source),
                             hint="run the quantize stage to completion first")
    uploaded = reused = 0
    for entry in {f.sha256: f for f in quantized.files}.values():
        assert entry.sha256 is not None
        if store.blob_size(entry.sha256) == entry.size:
            reused += 1
            continue
        store.put_blob(entry.sha256, source / entry.path, name=entry.path)
        uploaded += 1
    record = StashedQuantized(quantized=quantized, node=socket.gethostname(), stashed=utc_timestamp())
    files = [StageFile(path=f.path, sha256=f.sha256, size=f.size) for f in quantized.files if f.sha256 is not None]
    created = store.create_stage(QUANTIZED_STAGE, quantized.key, record.model_dump_json(indent=2).encode(), files)
    return StashResult(key=quantized.key, registry=store.location, created=created, uploaded_blobs=uploaded,
                       reused_blobs=reused)


def read_stashed(store: RegistryStore, key: str) -> StashedQuantized | None:
    """The stage record of quantize key ``key``, or None when no node stashed one. Raises ``IntegrityError`` for a
    record that does not parse or describes another key."""
    body = store.read_stage(QUANTIZED_STAGE, key)
    if body is None:
        return None
    where = f"{store.location} stages/{QUANTIZED_STAGE}/{key}.json"
    try:
        record = StashedQuantized.model_validate_json(body)
    except ValidationError as exc:
        raise IntegrityError(f"the stage record is not readable: {exc.errors()[0]['msg']}", where=where,
                             hint="delete that record; the cell then quantises again") from None
    if record.quantized.key != key:
        raise IntegrityError(f"the stage record holds key {record.quantized.key[:12]}, not {key[:12]}", where=where,
                             hint="delete that record; the cell then quantises again")
    return record


def fetch_quantized(store: RegistryStore, record: StashedQuantized, out_dir: Path,
                    cache: BlobCache) -> QuantizedCheckpoint:
    """Lay a stashed quantize output out at ``out_dir`` as the stage itself would have (metadata and completion
    marker last, renamed into place), its blobs fetched through ``cache``."""
    quantized = record.quantized
    fetch_files(store, quantized.files, cache, what=f"fetching quantised checkpoint {quantized.key[:12]}")
    # Hard links into the cache where they can be made (what the fetch above needed room for), else copies.
    same_disk = same_filesystem(cache.root, out_dir.parent)
    with staged_output(out_dir, what=f"laying out quantised checkpoint {quantized.key[:12]}", where=str(out_dir),
                       hint="free some space on the work directory's disk (workdir, or ENGINESMITH_WORKDIR)",
                       need_bytes=None if same_disk else sum(f.size for f in quantized.files)) as staging:
        for entry in quantized.files:
            assert entry.sha256 is not None
            target = staging / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            link_or_copy(cache.blob(entry.sha256), target)
        local = quantized.model_copy(update={"out_dir": str(out_dir.resolve())})
        (staging / METADATA_FILE).write_text(local.model_dump_json(indent=2))
        (staging / COMPLETE_MARKER).write_text(quantized.key + "\n")
    return local
