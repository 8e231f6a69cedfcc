"""Bad input and faults on the local backend: kills mid-transfer, damaged bytes, escaping paths, races.

The kill tests run the real CLI in a subprocess, slowed with ``--limit-rate`` so that a partial file grows
for seconds, and SIGKILL it (no cleanup handlers run, as after a crash or an OOM kill) at a moment they have
seen: the process is stopped, the partial state checked while it cannot move on, then killed.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

import registry.pull
from registry.cache import BlobCache
from registry.catalog import find_manifest, load_manifest
from registry.errors import IntegrityError, UnsafePathError
from registry.local import TMP_DIR, LocalStore
from registry.manifest import Manifest
from registry.names import Ref, manifest_path
from registry.publish import publish_artefact
from registry.pull import pull_artefact
from registry.transfer import write_hashing
from tests.conftest import run_cli
from tests.registry_helpers import (
    MIB,
    big_files,
    cli_json,
    deterministic_bytes,
    file_digests,
    race,
    read_artefact,
    registry_env,
    size_or_zero,
    start_cli,
    tiny_files,
    write_artefact,
)
from tests.waiting import kill_when

KILL_WAIT_S = 60  # a safety net: the kills wait for what they observe, however slow the machine


def test_a_publish_killed_half_way_leaves_no_manifest_and_the_next_one_succeeds(tmp_path: Path) -> None:
    source = write_artefact(tmp_path / "build", files=big_files(8 * MIB, parts=4))
    registry = tmp_path / "registry"
    env = registry_env(str(registry), tmp_path / "cache")
    log = tmp_path / "publish.log"
    # 2 MiB/s writes ~100 KiB slices: each 2 MiB blob sits part-written in tmp/ for most of a second.
    publisher = start_cli("publish", str(source), "--jobs", "1", "--limit-rate", "2M", env=env, log=log)

    def half_way() -> bool:
        uploading = any(size_or_zero(p) > 0 for p in (registry / TMP_DIR).glob("*.part"))
        return uploading and not any((registry / "manifests").rglob("*.json"))

    kill_when(publisher, half_way, "a part-written upload in the registry's tmp/ and no manifest",
              timeout_s=KILL_WAIT_S, log=log)

    assert not any((registry / "manifests").rglob("*.json"))
    assert cli_json("ls", env=env) == []
    assert run_cli("pull", "tiny-llama", "--dry-run", env=env).returncode == 2

    again = cli_json("publish", str(source), env=env)
    assert again["created"] and again["resumed_bytes"] > 0  # the killed upload's partial file was continued
    assert cli_json("ls", env=env)[0]["artefacts"] == 1
    dest = tmp_path / "served"
    cli_json("pull", "tiny-llama", "--dest", str(dest), env=env)
    artefact = read_artefact(source)
    assert file_digests(dest, [f.path for f in artefact.files]) == {f.path: f.sha256 for f in artefact.files}

    cli_json("gc", "--grace", "0", env=env)  # nothing left for it: the publish took the killed upload over
    assert list((registry / TMP_DIR).iterdir()) == []


def test_a_pull_killed_half_way_resumes_without_fetching_finished_bytes(tmp_path: Path) -> None:
    files = {"weights.safetensors": big_files(12 * MIB, parts=1)["rank0.safetensors"], **tiny_files()}
    source = write_artefact(tmp_path / "build", files=files)
    artefact = read_artefact(source)
    store = LocalStore(tmp_path / "registry")
    publish_artefact(store, source)
    cache_dir = tmp_path / "cache"
    env = registry_env(str(store.root), cache_dir)
    dest = tmp_path / "served"
    weights = next(f for f in artefact.files if f.path == "weights.safetensors")
    cache = BlobCache(cache_dir)
    log = tmp_path / "pull.log"
    puller = start_cli("pull", "tiny-llama", "--dest", str(dest), "--jobs", "1", "--limit-rate", "4M", env=env,
                       log=log)
    kill_when(puller, lambda: 4 * MIB <= cache.partial_bytes(str(weights.sha256)) < weights.size,
              "at least 4 MiB, not all, of the weights in the cache's partial file", timeout_s=KILL_WAIT_S, log=log)
    kept = cache.partial_bytes(str(weights.sha256))
    assert 0 < kept < weights.size and not dest.exists()
    finished = sum(p.stat().st_size for p in (cache_dir / "blobs" / "sha256").glob("*")) if (
        cache_dir / "blobs").exists() else 0

    resumed = cli_json("pull", "tiny-llama", "--dest", str(dest), env=env)

    assert resumed["resumed_bytes"] == kept
    assert resumed["cached_bytes"] == finished
    assert resumed["downloaded_bytes"] == sum(b["size"] for b in resumed["plan"]["blobs"]) - kept - finished
    assert file_digests(dest, [f.path for f in artefact.files]) == {f.path: f.sha256 for f in artefact.files}
    assert cache.partials(str(weights.sha256)) == []  # the killed download's claimed file was taken over


def test_a_damaged_partial_download_is_deleted_and_fetched_again(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "registry")
    publish_artefact(store, write_artefact(tmp_path / "build"))
    manifest = find_manifest(store, Ref("tiny-llama", channel="latest"))
    weights = next(f for f in manifest.artefact.files if f.path == "model.safetensors")
    cache = BlobCache(tmp_path / "cache")
    cache.part(str(weights.sha256)).parent.mkdir(parents=True)
    cache.part(str(weights.sha256)).write_bytes(b"\0" * (weights.size // 2))  # wrong bytes, right length

    result = pull_artefact(store, manifest, dest=tmp_path / "dest", cache=cache)

    assert result.refetched == ["model.safetensors"]
    assert result.resumed_bytes == weights.size // 2
    assert file_digests(tmp_path / "dest", ["model.safetensors"]) == {"model.safetensors": weights.sha256}


class _HoldAfterEachWrite:
    """Progress that holds one file's download after each write until the pull is cancelled: that file is then
    part-way, whatever the timing, when the other file's failure stops the pull."""

    def __init__(self, held: str) -> None:
        self.held = held
        self.cancel: threading.Event | None = None  # the pull's own, caught on its way into write_hashing

    def started(self, name: str, total_bytes: int, done_bytes: int) -> None:
        pass

    def advanced(self, name: str, bytes_count: int) -> None:
        if name == self.held:
            assert self.cancel is not None
            assert self.cancel.wait(timeout=60), f"the pull was not cancelled while {name} was held (60 s)"

    def finished(self, name: str) -> None:
        pass


def test_the_first_failure_stops_the_other_downloads_and_keeps_their_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {"a.safetensors": deterministic_bytes(24 * MIB, 1), "b.safetensors": deterministic_bytes(4 * MIB, 2)}
    store = LocalStore(tmp_path / "registry")
    publish_artefact(store, write_artefact(tmp_path / "build", files=files))
    manifest = find_manifest(store, Ref("tiny-llama", channel="latest"))
    a, b = (next(f for f in manifest.artefact.files if f.path == p) for p in ("a.safetensors", "b.safetensors"))
    damaged = store.root / "blobs" / "sha256" / str(b.sha256)
    damaged.chmod(0o644)
    damaged.write_bytes(b"\0" * b.size)
    cache = BlobCache(tmp_path / "cache")
    hold = _HoldAfterEachWrite("a.safetensors")

    def write_catching_cancel(*args, **kwargs):  # type: ignore[no-untyped-def]
        hold.cancel = kwargs["cancel"]
        return write_hashing(*args, **kwargs)

    monkeypatch.setattr(registry.pull, "write_hashing", write_catching_cancel)
    with pytest.raises(IntegrityError, match=r"b\.safetensors"):
        pull_artefact(store, manifest, dest=tmp_path / "dest", cache=cache, progress=hold)
    monkeypatch.undo()

    kept = size_or_zero(cache.part(str(a.sha256)))  # parked under the shared name
    assert 0 < kept < a.size  # a.safetensors stopped part-way, and what it had stays for the next pull
    store.put_blob(str(b.sha256), write_artefact(tmp_path / "again", files=files) / "b.safetensors")
    resumed = pull_artefact(store, manifest, dest=tmp_path / "dest", cache=cache)
    assert resumed.resumed_bytes == kept and resumed.downloaded_bytes == a.size - kept + b.size


def test_a_blob_that_stays_wrong_fails_the_pull_naming_the_file(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "registry")
    source = write_artefact(tmp_path / "build")
    publish_artefact(store, source)
    weights = next(f for f in read_artefact(source).files if f.path == "model.safetensors")
    blob = store.root / "blobs" / "sha256" / str(weights.sha256)
    blob.chmod(0o644)
    blob.write_bytes(b"x" * weights.size)  # bit rot in the registry
    env = registry_env(str(store.root), tmp_path / "cache")

    failed = run_cli("pull", "tiny-llama", "--dest", str(tmp_path / "dest"), env=env)

    assert failed.returncode == 2
    assert "model.safetensors" in failed.stderr and "fetched twice" in failed.stderr
    assert "Re-publish" in failed.stderr and "Traceback" not in failed.stderr
    assert "CACHE_LOCKS" not in failed.stderr  # #52: no advice to turn a safety off for a damaged blob
    assert not (tmp_path / "dest").exists()
    cache = BlobCache(tmp_path / "cache")
    assert not cache.blob(str(weights.sha256)).exists() and cache.partials(str(weights.sha256)) == []


@pytest.mark.parametrize("escaping_path", ["../../escaped.txt", "/tmp/enginesmith-escaped.txt"])
def test_a_manifest_whose_paths_escape_is_refused_before_anything_is_written(
    tmp_path: Path, escaping_path: str
) -> None:
    store = LocalStore(tmp_path / "registry")
    good = publish_artefact(store, write_artefact(tmp_path / "build"))
    document = json.loads(load_manifest(store, "tiny-llama", good.key).to_bytes())
    document["key"] = "evil-key"
    document["artefact"]["files"][0]["path"] = escaping_path
    (store.root / manifest_path("tiny-llama", "evil-key")).write_text(json.dumps(document))
    env = registry_env(str(store.root), tmp_path / "cache")
    dest = tmp_path / "sub" / "dest"

    refused = run_cli("pull", "tiny-llama@evil-key", "--dest", str(dest), env=env)

    assert refused.returncode == 2, refused.stderr
    assert escaping_path in refused.stderr and "do not pull it" in refused.stderr
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/enginesmith-escaped.txt").exists()
    assert not dest.exists() and not (tmp_path / "cache").exists()
    # built in code rather than read from storage, the same manifest is refused by the model itself
    with pytest.raises(ValueError, match=r"escapes|absolute"):
        Manifest.model_validate(document)


@pytest.mark.parametrize("linked", ["model.safetensors", "extra"])
def test_publish_refuses_symbolic_links_even_with_the_right_bytes(tmp_path: Path, linked: str) -> None:
    source = write_artefact(tmp_path / "build")
    outside = tmp_path / "outside"
    outside.mkdir()
    original = source / linked
    moved = outside / linked
    original.rename(moved)
    original.symlink_to(moved)  # same bytes, but not inside the artefact
    store = LocalStore(tmp_path / "registry")

    with pytest.raises(UnsafePathError, match="symbolic link"):
        publish_artefact(store, source)
    assert store.list_models() == []


def test_a_changed_file_is_refused_naming_it(tmp_path: Path) -> None:
    source = write_artefact(tmp_path / "build")
    (source / "config.json").write_text('{"edited": true}')
    with pytest.raises(IntegrityError, match=r"config\.json"):
        publish_artefact(LocalStore(tmp_path / "registry"), source)


def test_two_concurrent_publishes_of_the_same_key_both_succeed_with_one_manifest(tmp_path: Path) -> None:
    source = write_artefact(tmp_path / "build", files=big_files(4 * MIB, parts=2))
    registry = tmp_path / "registry"
    env = registry_env(str(registry), tmp_path / "cache")
    publishers = [
        start_cli("publish", str(source), "--json", "--limit-rate", "4M", env=env, log=tmp_path / f"p{i}.log")
        for i in range(2)
    ]
    codes = [p.wait(timeout=120) for p in publishers]
    outputs = [(tmp_path / f"p{i}.log").read_text() for i in range(2)]
    assert codes == [0, 0], outputs
    results = [json.loads(text[text.index("{"):]) for text in outputs]
    assert sorted(r["created"] for r in results) == [False, True]
    assert [p.name for p in (registry / "manifests" / "tiny-llama").iterdir()] == [f"{results[0]['key']}.json"]
    state = LocalStore(registry).read_ref("tiny-llama", "latest")
    assert state is not None and state.key == results[0]["key"]


def test_exactly_one_of_many_concurrent_creates_wins(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "registry")
    outcomes = race(8, lambda index: store.create_manifest("tiny-llama", "k1", f'{{"writer": {index}}}'.encode()))
    assert sorted(outcomes) == [False] * 7 + [True]
    assert json.loads(store.read_manifest("tiny-llama", "k1") or b"")["writer"] in range(8)
    assert os.listdir(store.root / TMP_DIR) == []
