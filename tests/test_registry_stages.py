"""A quantised checkpoint handed between nodes through the registry (``registry.stages``): stashed by the node that
quantised it, fetched by the node that builds, on the local backend and on S3 (a real SeaweedFS on loopback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from enginesmith.core.artefacts import COMPLETE_MARKER, METADATA_FILE, QuantizedCheckpoint
from enginesmith.core.checkpoints.models import CheckpointFile
from registry.cache import BlobCache
from registry.errors import IntegrityError
from registry.gc import collect_garbage
from registry.local import LocalStore
from registry.manifest import parse_timestamp
from registry.names import blob_path, stage_path
from registry.publish import publish_artefact
from registry.stages import QUANTIZED_STAGE, fetch_quantized, read_stashed, stash_quantized
from registry.store import RegistryStore
from tests.registry_helpers import QUANTIZE_KEY, exports, file_digests, tiny_files, write_artefact, write_quantized
from tests.seaweedfs import SeaweedServer, requires_weed


def hand_over(store: RegistryStore, tmp_path: Path) -> tuple[QuantizedCheckpoint, Path, QuantizedCheckpoint]:
    made = write_quantized(tmp_path / "big-node" / "quantized" / QUANTIZE_KEY[:16], exports())
    stashed = stash_quantized(store, made)
    assert stashed.created and stashed.uploaded_blobs == 3 and stashed.reused_blobs == 0  # 5 files, 3 contents
    record = read_stashed(store, QUANTIZE_KEY)
    assert record is not None and record.quantized.files == made.files
    out_dir = tmp_path / "build-node" / "quantized" / QUANTIZE_KEY[:16]
    fetched = fetch_quantized(store, record, out_dir, BlobCache(tmp_path / "build-node" / "cache"))
    return made, out_dir, fetched


def test_a_stashed_quantize_output_is_fetched_byte_for_byte_where_the_build_runs(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "registry")
    made, out_dir, fetched = hand_over(store, tmp_path)

    paths = [f.path for f in made.files]
    assert file_digests(out_dir, paths) == {f.path: f.sha256 for f in made.files}
    assert fetched.out_dir == str(out_dir.resolve()) and fetched.key == made.key
    # As the quantize stage's own output: the build stage reads the marker and the metadata.
    assert (out_dir / COMPLETE_MARKER).read_text() == QUANTIZE_KEY + "\n"
    assert QuantizedCheckpoint.model_validate_json((out_dir / METADATA_FILE).read_text()) == fetched
    assert not out_dir.with_name(out_dir.name + ".partial").exists()
    # Stashing again changes nothing; the record is not an artefact that listings or resolution see.
    again = stash_quantized(store, made)
    assert not again.created and again.uploaded_blobs == 0 and again.reused_blobs == 3
    assert store.list_models() == [] and store.list_stage_keys(QUANTIZED_STAGE) == [QUANTIZE_KEY]


def test_nothing_stashed_reads_as_none_and_a_damaged_record_is_named(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "registry")
    assert read_stashed(store, QUANTIZE_KEY) is None
    path = store.root / stage_path(QUANTIZED_STAGE, QUANTIZE_KEY)
    path.parent.mkdir(parents=True)
    path.write_text("{half a record")
    with pytest.raises(IntegrityError, match="stage record is not readable") as raised:
        read_stashed(store, QUANTIZE_KEY)
    assert f"stages/quantized/{QUANTIZE_KEY}.json" in str(raised.value.where)
    other = "b2" * 32
    made = write_quantized(tmp_path / "q", exports(), key=other)
    store.create_stage(QUANTIZED_STAGE, "c3" * 32, json.dumps({
        "quantized": json.loads(made.model_dump_json()), "node": "n", "stashed": "2026-12-01T00:00:00+00:00"}).encode())
    with pytest.raises(IntegrityError, match=f"holds key {other[:12]}"):
        read_stashed(store, "c3" * 32)


def test_a_damaged_blob_is_refused_and_leaves_no_quantize_output(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "registry")
    made = write_quantized(tmp_path / "big-node", exports())
    stash_quantized(store, made)
    weights = next(f for f in made.files if f.path == "trtllm/rank0.safetensors")
    assert weights.sha256
    damaged = store.root / blob_path(weights.sha256)
    damaged.chmod(0o644)
    damaged.write_bytes(b"x" * weights.size)  # same size, other bytes
    record = read_stashed(store, QUANTIZE_KEY)
    assert record is not None
    out_dir = tmp_path / "build-node" / "quantized" / "k"
    with pytest.raises(IntegrityError, match="do not match sha256"):
        fetch_quantized(store, record, out_dir, BlobCache(tmp_path / "build-node" / "cache"))
    assert not out_dir.exists() and not out_dir.with_name("k.partial").exists()


def test_gc_keeps_a_recent_stash_with_its_blobs_and_drops_an_old_one(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "registry")
    made = write_quantized(tmp_path / "big-node", exports())
    stash_quantized(store, made)
    artefact = publish_artefact(store, write_artefact(tmp_path / "artefact", files=tiny_files(7)))
    record = read_stashed(store, QUANTIZE_KEY)
    assert record is not None
    stashed_at = parse_timestamp(record.stashed).timestamp()
    stash_blobs = {f.sha256 for f in made.files}

    kept = collect_garbage(store, grace_s=0, now=stashed_at + 3600)
    assert kept.kept_stage_records == 1 and kept.deleted_stage_records == [] and kept.deleted_blobs == 0
    assert stash_blobs <= {b.digest for b in store.list_blobs()}

    dropped = collect_garbage(store, grace_s=0, now=stashed_at + 8 * 86400)
    assert dropped.deleted_stage_records == [f"quantized/{QUANTIZE_KEY}"]
    assert read_stashed(store, QUANTIZE_KEY) is None
    left = {b.digest for b in store.list_blobs()}
    assert not (stash_blobs - {f.sha256 for f in read_manifest_files(store, artefact.key)}) & left
    assert dropped.kept_manifests == 1  # the artefact is untouched


def read_manifest_files(store: LocalStore, key: str) -> list[CheckpointFile]:
    from registry.catalog import load_manifest

    return load_manifest(store, "tiny-llama", key).artefact.files


@requires_weed
@pytest.mark.slow
def test_the_handover_on_s3(tmp_path: Path, seaweedfs: SeaweedServer, s3_env: dict[str, str], prefix: str) -> None:
    from registry.store import open_store

    store = open_store(seaweedfs.registry_url(prefix), s3_endpoint=seaweedfs.endpoint)
    made, out_dir, _ = hand_over(store, tmp_path)
    assert file_digests(out_dir, [f.path for f in made.files]) == {f.path: f.sha256 for f in made.files}
    assert store.list_models() == [] and store.list_stage_keys(QUANTIZED_STAGE) == [QUANTIZE_KEY]
    assert not stash_quantized(store, made).created  # created once: a conditional PUT
