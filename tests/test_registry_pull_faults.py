"""Pulls against the faults real clusters produce: a connection cut mid-blob (a network double in front of the
real S3 server), a storage read error, two pulls sharing a cache whose locks do not hold, and a disk too small or
filled by someone else mid-pull (a size-limited tmpfs in a private mount namespace)."""

from __future__ import annotations

import errno
import uuid
from collections.abc import Generator
from pathlib import Path

import pytest

from registry.cache import BlobCache
from registry.catalog import find_manifest
from registry.errors import RegistryUnavailableError
from registry.local import LocalStore
from registry.names import Ref
from registry.publish import publish_artefact
from registry.pull import RESUME_ATTEMPTS, pull_artefact
from registry.s3 import S3Store
from tests.conftest import run_cli
from tests.cutting_proxy import CuttingProxy
from tests.registry_helpers import (
    MIB,
    deterministic_bytes,
    file_digests,
    immutable,
    read_artefact,
    registry_env,
    start_cli,
    tiny_files,
    write_artefact,
)
from tests.seaweedfs import BUCKET, SeaweedServer, requires_weed
from tests.small_disk import on_small_disk, requires_mount_namespace
from tests.waiting import pause_when, resume, wait_for

WAIT_S = 60  # a safety net: the tests wait for what they observe


@requires_weed
@pytest.mark.slow
def test_a_connection_cut_mid_blob_is_resumed_in_the_same_pull_fetching_each_byte_once(
    seaweedfs: SeaweedServer, s3_env: dict[str, str], tmp_path: Path
) -> None:
    files = {"weights.safetensors": deterministic_bytes(3 * MIB, 7), **tiny_files()}
    source = write_artefact(tmp_path / "build", files=files)
    artefact = read_artefact(source)
    weights = next(f for f in artefact.files if f.path == "weights.safetensors")
    prefix = f"cut-{uuid.uuid4().hex[:8]}"
    publish_artefact(S3Store(BUCKET, prefix, endpoint_url=seaweedfs.endpoint), source)
    # More cuts than the retry budget: the pull gets through only because every cut came after new bytes.
    cuts, cut_after = RESUME_ATTEMPTS + 1, weights.size // 8 + 12_345  # not on a read-chunk boundary
    proxy = CuttingProxy(seaweedfs.endpoint, cut_digest=str(weights.sha256), cut_after_bytes=cut_after, cuts=cuts)

    with proxy.running():
        through_proxy = S3Store(BUCKET, prefix, endpoint_url=proxy.endpoint)
        manifest = find_manifest(through_proxy, Ref("tiny-llama", channel="latest"))
        result = pull_artefact(through_proxy, manifest, dest=tmp_path / "dest", cache=BlobCache(tmp_path / "cache"))

    assert proxy.cuts_left == 0
    assert proxy.ranges[str(weights.sha256)] == [""] + [f"bytes={cut_after * i}-" for i in range(1, cuts + 1)]
    assert proxy.body_bytes[str(weights.sha256)] == weights.size  # each byte crossed the network once
    assert result.downloaded_bytes == artefact_bytes(artefact) and result.refetched == []
    assert file_digests(tmp_path / "dest", [f.path for f in artefact.files]) == {f.path: f.sha256
                                                                                for f in artefact.files}


def artefact_bytes(artefact) -> int:  # type: ignore[no-untyped-def]
    return sum({f.sha256: f.size for f in artefact.files}.values())


class FlakyDisk(LocalStore):
    """TEST DOUBLE for a storage read error (NFS answering EIO): the first ``failures`` reads of each blob stop
    with an ``OSError`` after ``good_bytes``."""

    def __init__(self, root: Path, *, good_bytes: int, failures: int) -> None:
        super().__init__(root)
        self.good_bytes, self.failures_left, self.offsets = good_bytes, failures, []

    def read_blob(self, digest: str, offset: int = 0) -> Generator[bytes, None, None]:
        self.offsets.append(offset)
        sent = 0
        for chunk in super().read_blob(digest, offset):
            if self.failures_left and sent + len(chunk) > self.good_bytes:
                self.failures_left -= 1
                yield chunk[: self.good_bytes - sent]
                raise OSError(errno.EIO, "Input/output error")
            sent += len(chunk)
            yield chunk


def test_a_storage_read_error_is_resumed_and_one_that_persists_ends_the_pull_saying_it_resumes(
    tmp_path: Path
) -> None:
    files = {"weights.safetensors": deterministic_bytes(2 * MIB, 3)}
    source = write_artefact(tmp_path / "build", files=files)
    flaky = FlakyDisk(tmp_path / "registry", good_bytes=300_000, failures=2)
    publish_artefact(flaky, source)
    manifest = find_manifest(flaky, Ref("tiny-llama", channel="latest"))

    result = pull_artefact(flaky, manifest, dest=tmp_path / "dest", cache=BlobCache(tmp_path / "cache"))
    assert flaky.offsets[-3:] == [0, 300_000, 600_000]
    assert result.downloaded_bytes == 2 * MIB

    dead = FlakyDisk(tmp_path / "registry", good_bytes=0, failures=10**6)  # never another byte
    with pytest.raises(RegistryUnavailableError) as failure:
        pull_artefact(dead, manifest, dest=tmp_path / "dest2", cache=BlobCache(tmp_path / "cache2"))
    assert len(dead.offsets) == RESUME_ATTEMPTS
    assert "fetched 0 bytes" in failure.value.message and "resumes from byte 0" in str(failure.value)


def test_two_pulls_into_one_cache_without_working_locks_write_separate_files_and_agree(tmp_path: Path) -> None:
    files = {"weights.safetensors": deterministic_bytes(12 * MIB, 5), **tiny_files()}
    source = write_artefact(tmp_path / "build", files=files)
    artefact = read_artefact(source)
    weights = next(f for f in artefact.files if f.path == "weights.safetensors")
    store = LocalStore(tmp_path / "registry")
    publish_artefact(store, source)
    cache = BlobCache(tmp_path / "cache")
    env = registry_env(str(store.root), cache.root, {"ENGINESMITH_CACHE_LOCKS": "off"})

    def writing(count: int) -> bool:
        return sum(1 for p in cache.partials(str(weights.sha256)) if p.stat().st_size > 0) >= count

    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    first = start_cli("pull", "tiny-llama", "--dest", str(tmp_path / "a"), "--jobs", "1", "--limit-rate", "4M",
                      env=env, log=logs[0])
    # The first is held with bytes in its partial file until the second writes too: both download at once.
    pause_when(first, lambda: writing(1), "the first pull's partial file", timeout_s=WAIT_S, log=logs[0])
    second = start_cli("pull", "tiny-llama", "--dest", str(tmp_path / "b"), "--jobs", "1", "--limit-rate", "4M",
                       env=env, log=logs[1])
    try:
        wait_for(lambda: writing(2), "a second partial file, written by the second pull", timeout_s=WAIT_S,
                 process=second, log=logs[1])
    finally:
        resume(first)
    codes = [first.wait(timeout=120), second.wait(timeout=120)]

    assert codes == [0, 0], [log.read_text() for log in logs]
    expected = {f.path: f.sha256 for f in artefact.files}
    assert file_digests(tmp_path / "a", list(expected)) == expected == file_digests(tmp_path / "b", list(expected))
    assert cache.partials(str(weights.sha256)) == []


# --- a disk too small, and one filled mid-pull ------------------------------------------------------------

@requires_mount_namespace
def test_a_pull_onto_a_disk_too_small_fails_before_writing_naming_bytes_needed_and_free(tmp_path: Path) -> None:
    files = {"weights.safetensors": deterministic_bytes(24 * MIB, 9)}
    store = LocalStore(tmp_path / "registry")
    publish_artefact(store, write_artefact(tmp_path / "build", files=files))

    seen = on_small_disk(tmp_path, 16, "pull-cli", str(store.root))

    assert seen["returncode"] == 2, seen
    assert "not enough disk" in seen["stderr"] and "Traceback" not in seen["stderr"]
    assert f"{24 * MIB} bytes needed" in seen["stderr"]
    assert f"{seen['free_before']} free" in seen["stderr"]
    assert seen["files_after"] == []  # nothing written: no cache folders, no partial file, no destination


@requires_mount_namespace
def test_a_disk_filled_by_someone_else_mid_pull_fails_cleanly_and_keeps_nothing_half_written(tmp_path: Path) -> None:
    files = {"weights.safetensors": deterministic_bytes(8 * MIB, 11)}
    store = LocalStore(tmp_path / "registry")
    publish_artefact(store, write_artefact(tmp_path / "build", files=files))

    seen = on_small_disk(tmp_path, 96, "pull-filled", str(store.root))

    assert seen["error"] == "DiskFullError", seen
    assert "the disk filled while pulling tiny-llama@" in seen["message"]
    assert seen["partials"] == [] and seen["blobs"] == [] and seen["dest_exists"] is False, seen
    assert seen["staging"] == []


@requires_mount_namespace
def test_a_pull_onto_a_read_only_destination_is_refused_before_anything_is_fetched(tmp_path: Path) -> None:
    """#31: a --dest on a read-only filesystem (a node's image mounted ro) is refused naming it and --dest, before a
    byte is fetched: the cache stays empty, nothing is staged."""
    store = LocalStore(tmp_path / "registry")
    publish_artefact(store, write_artefact(tmp_path / "build"))

    seen = on_small_disk(tmp_path, 256, "cli-read-only", "pull", "tiny-llama", "--registry", str(store.root),
                         "--cache-dir", "{disk}/cache", "--dest", "{disk}/read-only/models/tiny-llama")

    assert seen["returncode"] == 2, seen
    message = " ".join(seen["stderr"].split())
    assert f"--dest: {tmp_path / 'small' / 'read-only'} is on a read-only filesystem" in message, message
    assert "Traceback" not in seen["stderr"]
    assert seen["files_after"] == ["read-only"], seen  # no cache directory, no partial, no staging directory


def test_a_destination_that_cannot_be_replaced_or_staged_is_named_and_the_fetched_blobs_are_kept(
    tmp_path: Path
) -> None:
    """#62: a --dest that exists but cannot be renamed (immutable, a read-only mount) ended in a PermissionError from
    os.rename, rc 1. Now one line naming the path, exit 2; the blobs stay in the cache, so the next pull fetches
    nothing. A name too long to stage beside fails for root too; an immutable --dest where chattr works."""
    store = LocalStore(tmp_path / "registry")
    publish_artefact(store, write_artefact(tmp_path / "build"))
    env = registry_env(str(store.root), tmp_path / "cache")
    long_name = tmp_path / ("m" * 240)  # a legal name, too long for its staging directory beside it
    staged = run_cli("pull", "tiny-llama", "--target", "cpu", "--dest", str(long_name), env=env)
    assert staged.returncode == 2 and "Traceback" not in staged.stderr, staged.stderr
    assert error_line(staged.stderr).startswith(f"error: --dest: laying out {long_name} failed: File name too long: ")
    assert not long_name.exists() and not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    assert len(list((tmp_path / "cache" / "blobs" / "sha256").iterdir())) == 3  # fetched, kept for the next pull

    dest = tmp_path / "dest"
    assert run_cli("pull", "tiny-llama", "--target", "cpu", "--dest", str(dest), env=env).returncode == 0
    with immutable(dest):
        renamed = run_cli("pull", "tiny-llama", "--target", "cpu", "--dest", str(dest), env=env)
    assert renamed.returncode == 2 and "Traceback" not in renamed.stderr, renamed.stderr
    assert error_line(renamed.stderr).startswith(
        f"error: --dest: laying out {dest} failed: Operation not permitted: {dest} -> ")
    assert (dest / "config.json").is_file() and sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) \
        == []  # the old directory is whole, no staging left


def error_line(stderr: str) -> str:
    """The one error line among a pull's progress bars."""
    return next(line for line in stderr.splitlines() if line.startswith("error:"))


def test_a_destination_under_a_file_is_refused_before_anything_is_fetched(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "registry")
    publish_artefact(store, write_artefact(tmp_path / "build"))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    refused = run_cli("pull", "tiny-llama", "--target", "cpu", "--dest", str(blocker / "tiny-llama"),
                      env=registry_env(str(store.root), tmp_path / "cache"))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.startswith(f"error: --dest: {blocker} is a file: cannot lay out {blocker / 'tiny-llama'}")
    assert not (tmp_path / "cache").exists()
