"""Resumable uploads and request ids on S3, against a real SeaweedFS server on loopback.

The bookkeeping test runs the real CLI in a subprocess, slowed with ``--limit-rate``, and SIGKILLs it at a moment it
has seen (parts stored, not all of them); the next publish must send only the parts that are missing, part by part.
Kills at random bytes, unslowed and many times, are ``tests/test_registry_kill_resume.py``.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest

from enginesmith.core.errors import UserError
from registry.cache import BlobCache
from registry.catalog import find_manifest
from registry.errors import NotFoundError
from registry.gc import collect_garbage
from registry.names import Ref
from registry.publish import publish_artefact
from registry.pull import pull_artefact
from registry.s3 import MULTIPART_PART_BYTES, S3Store
from tests.registry_helpers import (
    MIB,
    artefact_with_weights,
    deterministic_bytes,
    read_artefact,
    registry_env,
    start_cli,
)
from tests.seaweedfs import BUCKET, SeaweedServer, requires_weed, s3_client
from tests.waiting import kill_when, wait_for

pytestmark = [requires_weed, pytest.mark.slow]

WEIGHTS_BYTES = 256 * MIB  # 16 parts: enough to kill between some stored and all
KILL_WAIT_S = 300  # a safety net: the kill waits for what it observes, however slow the machine


@pytest.fixture
def client(seaweedfs: SeaweedServer) -> Any:
    return s3_client(seaweedfs)


def test_a_publish_killed_half_way_resumes_its_multipart_upload(
    seaweedfs: SeaweedServer, s3_env: dict[str, str], client: Any, prefix: str, tmp_path: Path
) -> None:
    source = artefact_with_weights(tmp_path / "build", WEIGHTS_BYTES)
    weights = next(f for f in read_artefact(source).files if f.path == "weights.safetensors")
    key = f"{prefix}/blobs/sha256/{weights.sha256}"
    part_count = WEIGHTS_BYTES // MULTIPART_PART_BYTES
    local_md5 = _part_md5s(source / weights.path, MULTIPART_PART_BYTES)
    env = registry_env(seaweedfs.registry_url(prefix), tmp_path / "cache", s3_env)
    log = tmp_path / "publish.log"
    publisher = start_cli("publish", str(source), "--limit-rate", "32M", env=env, log=log)

    def some_parts_not_all() -> bool:
        return part_count // 2 <= len({p["PartNumber"] for p in _stored_parts(client, key)}) < part_count

    kill_when(publisher, some_parts_not_all,
              f"at least {part_count // 2} of the weights' {part_count} parts stored, not all",
              timeout_s=KILL_WAIT_S, log=log)

    assert _object_keys(client, f"{prefix}/manifests/") == []
    left_by_kill = _verified(_stored_parts(client, key), local_md5)
    assert 0 < len(left_by_kill) < part_count

    blobs_before = set(_object_keys(client, f"{prefix}/blobs/sha256/"))
    small_blobs = {f.sha256: f.size for f in read_artefact(source).files if f.sha256 != weights.sha256}
    small_bytes_to_send = sum(size for digest, size in small_blobs.items()
                              if f"{prefix}/blobs/sha256/{digest}" not in blobs_before)
    store = S3Store(BUCKET, prefix, endpoint_url=seaweedfs.endpoint)
    sent_parts: dict[int, int] = {}  # part number → bytes, as the client sent them
    listed_by_resume: list[dict[str, Any]] = []
    store._client.meta.events.register(
        "before-parameter-build.s3.UploadPart",
        lambda params, **_: sent_parts.__setitem__(params["PartNumber"], params["ContentLength"]))
    store._client.meta.events.register(
        "after-call.s3.ListParts", lambda parsed, **_: listed_by_resume.extend(parsed.get("Parts", [])))

    resumed = publish_artefact(store, source)

    found_by_resume = _verified(listed_by_resume, local_md5)
    assert left_by_kill.keys() <= found_by_resume.keys()  # a part may still land after the kill, never vanish
    assert sorted(sent_parts) == sorted(set(range(1, part_count + 1)) - found_by_resume.keys())
    assert sum(sent_parts.values()) < WEIGHTS_BYTES - sum(left_by_kill.values()) + MULTIPART_PART_BYTES
    assert resumed.created
    assert resumed.resumed_bytes == sum(found_by_resume.values())
    assert resumed.uploaded_bytes == sum(sent_parts.values()) + small_bytes_to_send

    assert _object_keys(client, f"{prefix}/manifests/") == [f"{prefix}/manifests/tiny-llama/{resumed.key}.json"]
    assert client.list_multipart_uploads(Bucket=BUCKET, Prefix=f"{prefix}/").get("Uploads", []) == []
    assert client.head_object(Bucket=BUCKET, Key=key)["Metadata"]["sha256"] == weights.sha256
    manifest = find_manifest(store, Ref("tiny-llama", channel="latest"))
    pulled = pull_artefact(store, manifest, dest=tmp_path / "served", cache=BlobCache(tmp_path / "pull-cache"))
    with (Path(pulled.dest) / weights.path).open("rb") as handle:
        assert hashlib.file_digest(handle, "sha256").hexdigest() == weights.sha256


def test_stored_parts_are_kept_only_when_their_size_and_md5_match_the_file(
    seaweedfs: SeaweedServer, s3_env: dict[str, str], client: Any, prefix: str, tmp_path: Path
) -> None:
    part_bytes = 5 * MIB
    data = deterministic_bytes(4 * part_bytes + MIB, 7)  # parts 1-4 full, part 5 short
    digest = hashlib.sha256(data).hexdigest()
    (tmp_path / "weights").write_bytes(data)
    key = f"{prefix}/blobs/sha256/{digest}"
    upload_id = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    for number, body in [(1, data[:part_bytes]),  # right
                         (2, bytes(part_bytes)),  # right size, wrong bytes
                         (3, data[2 * part_bytes:3 * part_bytes - 1]),  # one byte short
                         (4, data[3 * part_bytes:4 * part_bytes])]:  # right; part 5 is missing
        client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload_id, PartNumber=number, Body=body)
    store = S3Store(BUCKET, prefix, endpoint_url=seaweedfs.endpoint, multipart_part_bytes=part_bytes)
    sent_parts: list[int] = []
    store._client.meta.events.register("before-parameter-build.s3.UploadPart",
                                       lambda params, **_: sent_parts.append(params["PartNumber"]))
    progress = _RecordedProgress()

    resumed_bytes = store.put_blob(digest, tmp_path / "weights", progress=progress, name="weights")

    assert sorted(sent_parts) == [2, 3, 5]
    assert resumed_bytes == 2 * part_bytes
    # Parts 1, 2 and 4 looked done when the upload was found (right size); part 2 was taken back once checked.
    assert progress.starts == [("weights", len(data), 3 * part_bytes)]
    assert 3 * part_bytes + progress.advanced_bytes == len(data) and progress.finishes == ["weights"]
    assert b"".join(store.read_blob(digest)) == data
    assert client.list_multipart_uploads(Bucket=BUCKET, Prefix=f"{prefix}/").get("Uploads", []) == []


def test_concurrent_publishers_of_one_blob_both_succeed_and_store_it_whole(
    seaweedfs: SeaweedServer, s3_env: dict[str, str], client: Any, prefix: str, tmp_path: Path
) -> None:
    data = deterministic_bytes(6 * 5 * MIB, 11)
    digest = hashlib.sha256(data).hexdigest()
    (tmp_path / "weights").write_bytes(data)
    key = f"{prefix}/blobs/sha256/{digest}"
    # An interrupted upload for all three to join: each sends parts the others send too, and completes it or finds
    # it completed.
    upload_id = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload_id, PartNumber=1, Body=data[:5 * MIB])
    barrier = threading.Barrier(3)
    outcomes: list[int | BaseException] = []

    def publish_blob() -> None:
        store = S3Store(BUCKET, prefix, endpoint_url=seaweedfs.endpoint, multipart_part_bytes=5 * MIB)
        barrier.wait()
        try:
            outcomes.append(store.put_blob(digest, tmp_path / "weights", name="weights"))
        except BaseException as error:
            outcomes.append(error)

    threads = [threading.Thread(target=publish_blob) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert [type(o) for o in outcomes] == [int] * 3, outcomes
    store = S3Store(BUCKET, prefix, endpoint_url=seaweedfs.endpoint)
    assert b"".join(store.read_blob(digest)) == data
    assert client.list_multipart_uploads(Bucket=BUCKET, Prefix=f"{prefix}/").get("Uploads", []) == []


def test_gc_aborts_uploads_idle_past_the_grace_period_and_keeps_active_ones(
    seaweedfs: SeaweedServer, s3_env: dict[str, str], client: Any, prefix: str
) -> None:
    store = S3Store(BUCKET, prefix, endpoint_url=seaweedfs.endpoint)
    idle_key, active_key = (f"{prefix}/blobs/sha256/{c * 64}" for c in "ab")
    client.create_multipart_upload(Bucket=BUCKET, Key=idle_key)
    active = client.create_multipart_upload(Bucket=BUCKET, Key=active_key)
    active_started = _upload(client, active_key)["Initiated"].timestamp()

    def part_stored_after_start() -> bool:
        client.upload_part(Bucket=BUCKET, Key=active_key, UploadId=active["UploadId"], PartNumber=1, Body=b"part")
        return _part_written(client, active_key, active["UploadId"]) > active_started

    wait_for(part_stored_after_start, "a part stored a second after its upload started (the server's clock)",
             timeout_s=30, interval_s=0.2)
    part_written = _part_written(client, active_key, active["UploadId"])
    hour = 3600.0

    assert collect_garbage(store, grace_s=hour).stale_uploads_removed == 0  # both started moments ago
    assert _upload_keys(client, prefix) == sorted([idle_key, active_key])

    # An hour after the part: both started more than an hour before, but one stored a part within the hour.
    assert collect_garbage(store, grace_s=hour, now=part_written + hour - 0.5).stale_uploads_removed == 1
    assert _upload_keys(client, prefix) == [active_key]

    assert collect_garbage(store, grace_s=hour, now=part_written + hour + 1).stale_uploads_removed == 1
    assert _upload_keys(client, prefix) == []


def test_s3_errors_carry_the_servers_request_id(
    seaweedfs: SeaweedServer, s3_env: dict[str, str], prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def request_ids_seen(store: S3Store) -> list[str]:
        seen: list[str] = []
        store._client.meta.events.register(
            "after-call.s3", lambda parsed, **_: seen.append(parsed["ResponseMetadata"]["RequestId"]))
        return seen

    missing_bucket = S3Store("no-such-bucket-here", prefix, endpoint_url=seaweedfs.endpoint)
    seen = request_ids_seen(missing_bucket)
    with pytest.raises(UserError, match="does not exist") as raised:
        missing_bucket.list_models()
    assert seen and f"S3 request id {seen[-1]}" in raised.value.message

    store = S3Store(BUCKET, prefix, endpoint_url=seaweedfs.endpoint)
    seen = request_ids_seen(store)
    with pytest.raises(NotFoundError) as missing:
        list(store.read_blob("f" * 64))
    assert seen and f"S3 request id {seen[-1]}" in missing.value.message

    wrong_secret = "not-the-right-secret-4711"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong_secret)
    refused = S3Store(BUCKET, prefix, endpoint_url=seaweedfs.endpoint)
    seen = request_ids_seen(refused)
    with pytest.raises(UserError, match="access denied") as denied:
        refused.list_models()
    assert seen and f"S3 request id {seen[-1]}" in denied.value.message
    assert wrong_secret not in denied.value.render()


class _RecordedProgress:
    def __init__(self) -> None:
        self.starts: list[tuple[str, int, int]] = []
        self.advanced_bytes = 0
        self.finishes: list[str] = []
        self._lock = threading.Lock()

    def started(self, name: str, total_bytes: int, done_bytes: int) -> None:
        self.starts.append((name, total_bytes, done_bytes))

    def advanced(self, name: str, bytes_count: int) -> None:
        with self._lock:
            self.advanced_bytes += bytes_count

    def finished(self, name: str) -> None:
        self.finishes.append(name)


def _part_md5s(path: Path, part_bytes: int) -> dict[int, tuple[str, int]]:
    """Part number → (MD5 hex, length) of ``path`` cut into parts of ``part_bytes``."""
    md5s = {}
    with path.open("rb") as handle:
        for number, body in enumerate(iter(lambda: handle.read(part_bytes), b""), start=1):
            md5s[number] = (hashlib.md5(body).hexdigest(), len(body))
    return md5s


def _verified(parts: list[dict[str, Any]], local_md5: dict[int, tuple[str, int]]) -> dict[int, int]:
    """Part number → size, for the stored parts that hold the local file's bytes (SeaweedFS lists every part sent
    under a number, not only the last)."""
    return {int(part["PartNumber"]): int(part["Size"]) for part in parts
            if (part["ETag"].strip('"'), int(part["Size"])) == local_md5.get(int(part["PartNumber"]))}


def _stored_parts(client: Any, key: str) -> list[dict[str, Any]]:
    """The parts stored so far for the unfinished uploads of ``key`` (none before one starts)."""
    parts: list[dict[str, Any]] = []
    for upload in client.list_multipart_uploads(Bucket=BUCKET, Prefix=key).get("Uploads", []):
        pages = client.get_paginator("list_parts").paginate(Bucket=BUCKET, Key=key, UploadId=upload["UploadId"])
        parts += [part for page in pages for part in page.get("Parts", [])]
    return parts


def _object_keys(client: Any, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(item["Key"] for page in pages for item in page.get("Contents", []))


def _upload(client: Any, key: str) -> dict[str, Any]:
    return next(u for u in client.list_multipart_uploads(Bucket=BUCKET, Prefix=key)["Uploads"] if u["Key"] == key)


def _upload_keys(client: Any, prefix: str) -> list[str]:
    uploads = client.list_multipart_uploads(Bucket=BUCKET, Prefix=f"{prefix}/").get("Uploads", [])
    return sorted(u["Key"] for u in uploads)


def _part_written(client: Any, key: str, upload_id: str) -> float:
    parts = client.list_parts(Bucket=BUCKET, Key=key, UploadId=upload_id)["Parts"]
    return max(p["LastModified"].timestamp() for p in parts)
