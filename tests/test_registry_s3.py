"""The registry on S3, against a real SeaweedFS server on loopback (started and stopped by the tests)."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from registry.cache import BlobCache
from registry.catalog import find_manifest
from registry.gc import collect_garbage
from registry.names import Ref
from registry.publish import publish_artefact
from registry.pull import pull_artefact
from registry.s3 import S3Store
from tests.conftest import run_cli
from tests.registry_helpers import (
    MIB,
    big_files,
    cli_json,
    file_digests,
    race,
    read_artefact,
    registry_env,
    start_cli,
    tiny_files,
    write_artefact,
)
from tests.seaweedfs import BUCKET, SeaweedServer, requires_weed, running_seaweedfs, s3_client
from tests.waiting import pause_when, resume, wait_for

pytestmark = [requires_weed, pytest.mark.slow]


def test_round_trip_on_s3(seaweedfs: SeaweedServer, s3_env: dict[str, str], prefix: str, tmp_path: Path) -> None:
    source = write_artefact(tmp_path / "build")
    artefact = read_artefact(source)
    env = registry_env(seaweedfs.registry_url(prefix), tmp_path / "cache", s3_env)

    published = cli_json("publish", str(source), env=env)
    assert published["created"] and published["uploaded_blobs"] == 3
    resolution = cli_json("resolve", "tiny-llama", "--target", "cpu", env=env)
    assert [(c["key"], c["status"]) for c in resolution["candidates"]] == [(artefact.key, "runnable")]
    dest = tmp_path / "served"
    cli_json("pull", "tiny-llama", "--target", "cpu", "--dest", str(dest), env=env)

    paths = [f.path for f in artefact.files]
    assert file_digests(dest, paths) == {f.path: f.sha256 for f in artefact.files} == file_digests(source, paths)
    listed = s3_client(seaweedfs).list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/")
    keys = sorted(item["Key"].removeprefix(prefix + "/") for item in listed["Contents"])
    assert keys == sorted([*(f"blobs/sha256/{d}" for d in {f.sha256 for f in artefact.files}),
                           f"manifests/tiny-llama/{artefact.key}.json", "refs/tiny-llama/latest"])


def test_republishing_is_a_no_op_and_creates_are_exclusive(
    seaweedfs: SeaweedServer, s3_env: dict[str, str], prefix: str, tmp_path: Path
) -> None:
    store = S3Store(BUCKET, prefix, endpoint_url=seaweedfs.endpoint)
    source = write_artefact(tmp_path / "build")
    first = publish_artefact(store, source)
    again = publish_artefact(store, source)
    assert first.created and not again.created and again.uploaded_blobs == 0

    outcomes = race(6, lambda index: store.create_manifest("tiny-llama", "raced", f'{{"writer": {index}}}'.encode()))
    assert sorted(outcomes) == [False] * 5 + [True]

    seen = store.read_ref("tiny-llama", "latest")
    assert seen is not None and seen.key == first.key
    assert store.write_ref("tiny-llama", "latest", "moved-by-someone", expected=seen)
    assert not store.write_ref("tiny-llama", "latest", first.key, expected=seen)
    assert not store.write_ref("tiny-llama", "latest", first.key, expected=None)


def test_history_records_on_s3_are_created_once_beside_the_artefacts(
    seaweedfs: SeaweedServer, s3_env: dict[str, str], prefix: str, tmp_path: Path
) -> None:
    from registry.history import ChannelMove, load_history, record_channel_move

    store = S3Store(BUCKET, prefix, endpoint_url=seaweedfs.endpoint)
    published = publish_artefact(store, write_artefact(tmp_path / "build"))
    outcomes = race(6, lambda index: store.create_history("tiny-llama", "raced", f'{{"writer": {index}}}'.encode()))
    assert sorted(outcomes) == [False] * 5 + [True]
    move = ChannelMove(model="tiny-llama", channel="stable", key=published.key, previous=None, actor="ci")
    assert record_channel_move(store, move)

    assert len(store.list_history("tiny-llama")) == 2 and store.read_history("tiny-llama", "absent") is None
    assert store.list_channels("tiny-llama") == ["latest"] and store.list_models() == ["tiny-llama"]
    history = load_history(store, "tiny-llama")
    assert [m.actor for m in history.channel_moves] == ["ci"]
    assert [u.entry for u in history.unreadable] == ["raced"]  # not a record of either kind
    assert [b.outcome.key for c in history.cells for b in c.builds] == [published.key]


def test_big_blobs_go_up_in_parts_and_come_back_verified(
    seaweedfs: SeaweedServer, s3_env: dict[str, str], prefix: str, tmp_path: Path
) -> None:
    store = S3Store(BUCKET, prefix, endpoint_url=seaweedfs.endpoint, multipart_part_bytes=5 * MIB)
    source = write_artefact(tmp_path / "build", files=big_files(12 * MIB, parts=1))
    artefact = read_artefact(source)
    publish_artefact(store, source)
    weights = next(f for f in artefact.files if f.path == "rank0.safetensors")
    head = s3_client(seaweedfs).head_object(Bucket=BUCKET, Key=f"{prefix}/blobs/sha256/{weights.sha256}")
    assert head["ETag"].strip('"').endswith("-3")  # three parts
    assert head["Metadata"]["sha256"] == weights.sha256

    manifest = find_manifest(store, Ref("tiny-llama", channel="latest"))
    pull_artefact(store, manifest, dest=tmp_path / "dest", cache=BlobCache(tmp_path / "cache"))
    assert file_digests(tmp_path / "dest", ["rank0.safetensors"]) == {"rank0.safetensors": weights.sha256}


def test_gc_on_s3_removes_orphans_and_abandoned_multipart_uploads(
    seaweedfs: SeaweedServer, s3_env: dict[str, str], prefix: str, tmp_path: Path
) -> None:
    store = S3Store(BUCKET, prefix, endpoint_url=seaweedfs.endpoint)
    publish_artefact(store, write_artefact(tmp_path / "build"))
    orphan = hashlib.sha256(b"orphan").hexdigest()
    (tmp_path / "orphan").write_bytes(b"orphan")
    store.put_blob(orphan, tmp_path / "orphan")
    client = s3_client(seaweedfs)
    client.create_multipart_upload(Bucket=BUCKET, Key=f"{prefix}/blobs/sha256/{'e' * 64}")

    result = collect_garbage(store, grace_s=0)

    assert result.deleted_blobs == 1 and result.stale_uploads_removed == 1
    assert orphan not in {b.digest for b in store.list_blobs()}
    assert len(list(store.list_blobs())) == 3  # the artefact's own blobs
    assert client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", []) == []


def test_bad_credentials_give_a_clear_error_that_does_not_show_the_secret(
    seaweedfs: SeaweedServer, prefix: str, tmp_path: Path
) -> None:
    secret = "not-the-right-secret-4711"
    env = registry_env(seaweedfs.registry_url(prefix), tmp_path / "cache",
                       {**seaweedfs.env, "AWS_SECRET_ACCESS_KEY": secret})
    result = run_cli("ls", env=env)
    assert result.returncode == 2
    assert "access denied" in result.stderr and "AWS_SECRET_ACCESS_KEY" in result.stderr
    assert secret not in result.stderr + result.stdout and "Traceback" not in result.stderr


def test_a_prefix_with_nothing_under_it_is_no_registry_not_an_empty_one(
    seaweedfs: SeaweedServer, s3_env: dict[str, str], prefix: str, tmp_path: Path
) -> None:
    """#62: an S3 prefix that does not exist listed as an empty registry (rc 0). A prefix is there once any object is
    stored under it (``prefix/``: a string prefix of another registry's does not count)."""
    publish_artefact(S3Store.from_url(seaweedfs.registry_url(prefix)), write_artefact(tmp_path / "build"))
    for absent in (f"{prefix}-elsewhere", prefix[:-1]):
        env = registry_env(seaweedfs.registry_url(absent), tmp_path / "cache", s3_env)
        listed = run_cli("ls", env=env)
        assert listed.returncode == 2 and listed.stdout == "" and "Traceback" not in listed.stderr, listed.stderr
        assert listed.stderr.startswith(f"error: ENGINESMITH_REGISTRY: no registry at s3://{BUCKET}/{absent} at "), \
            listed.stderr
        assert "no object is stored under that prefix" in listed.stderr
        assert s3_client(seaweedfs).list_objects_v2(Bucket=BUCKET, Prefix=f"{absent}/").get("KeyCount") == 0
    present = run_cli("ls", env=registry_env(seaweedfs.registry_url(prefix), tmp_path / "cache", s3_env))
    assert present.returncode == 0 and "tiny-llama" in present.stdout, present.stderr


def test_a_server_stopped_mid_pull_is_a_clear_error_and_the_next_pull_resumes(tmp_path: Path) -> None:
    with running_seaweedfs(tmp_path / "own-server") as server:
        # Big enough that the kernel's socket buffers cannot hold the rest when the server stops: loopback TCP
        # autotunes a receive buffer up to tcp_rmem's maximum (32 MiB on the CI machine), and a 40 MiB file once
        # arrived whole while the puller was stopped, so the pull finished after the server was gone.
        files = {"weights.safetensors": big_files(_unbufferable_bytes(), parts=1)["rank0.safetensors"],
                 **tiny_files()}
        source = write_artefact(tmp_path / "build", files=files)
        artefact = read_artefact(source)
        cache_dir = tmp_path / "cache"
        env = registry_env(server.registry_url("stopped"), cache_dir, server.env)
        cli_json("publish", str(source), env=env)
        weights = next(f for f in artefact.files if f.path == "weights.safetensors")
        cache = BlobCache(cache_dir)
        dest = tmp_path / "served"
        log = tmp_path / "pull.log"
        puller = start_cli("pull", "tiny-llama", "--dest", str(dest), "--jobs", "1", "--limit-rate", "8M", env=env,
                           log=log)
        try:
            # Stopped while it holds 4 MiB (not all) of the weights, the puller cannot finish before the server dies.
            pause_when(puller, lambda: 4 * MIB <= cache.partial_bytes(str(weights.sha256)) < weights.size,
                       "at least 4 MiB, not all, of the weights in the cache's partial file", timeout_s=60, log=log)
            server.stop(kill=True)
            resume(puller)
            try:
                code = puller.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the pull did not end within 120 s of the server stopping:\n{log.read_text()}")
        finally:
            if puller.poll() is None:
                puller.kill()
                puller.wait()
        message = log.read_text()
        assert code == 1, message
        assert "stopped answering" in message and "run the same command again" in message
        assert "Traceback" not in message
        kept = cache.partial_bytes(str(weights.sha256))
        assert 4 * MIB <= kept < weights.size and not dest.exists()

        server.start()
        # After a crash the S3 port answers before the volumes holding old data are back (500 until then).
        client = s3_client(server)
        manifest_key = f"stopped/manifests/tiny-llama/{artefact.key}.json"
        wait_for(lambda: _readable(client, manifest_key), "the restarted server to serve its old data", timeout_s=120,
                 log=server.log_path)
        resumed = cli_json("pull", "tiny-llama", "--dest", str(dest), env=env)

        assert resumed["resumed_bytes"] == kept
        assert resumed["downloaded_bytes"] == weights.size - kept
        assert file_digests(dest, [f.path for f in artefact.files]) == {f.path: f.sha256 for f in artefact.files}
        server.stop(kill=True)  # its data is thrown away; after a crash-restart a graceful stop can take 20 s


def _unbufferable_bytes() -> int:
    """Twice what loopback TCP can hold in flight (the largest receive plus send buffer), and at least 40 MiB."""
    def largest(name: str) -> int:
        try:
            return int(Path(f"/proc/sys/net/ipv4/{name}").read_text().split()[-1])
        except (OSError, ValueError, IndexError):
            return 32 * MIB
    return max(40 * MIB, 2 * (largest("tcp_rmem") + largest("tcp_wmem")))


def _readable(client, key: str) -> bool:  # client: a botocore S3 client
    try:
        client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    except Exception:
        return False
    return True


def test_an_s3_registry_without_boto3_names_the_extra_to_install(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """#31: the base install has no boto3; an s3:// registry says which extra provides it, not a raw ImportError."""
    import sys

    from enginesmith.core.errors import UserError
    from registry.store import open_store

    monkeypatch.setitem(sys.modules, "boto3", None)  # what `import boto3` meets where it is not installed
    store = open_store("s3://models/registry")
    with pytest.raises(UserError) as caught:
        store.read_manifest("tiny-llama", "k" * 64)
    assert "boto3 is not installed" in caught.value.message and caught.value.hint == "pip install 'enginesmith[s3]'"
