"""The registry on its embedded backend (a local directory): publish, list, resolve, pull, channels, gc, bundles."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path

import pytest

from enginesmith.core.errors import UserError
from registry.bundle import BundleStore, write_bundle
from registry.cache import BlobCache
from registry.catalog import find_manifest, list_model, load_manifest
from registry.errors import IntegrityError, NotFoundError
from registry.gc import collect_garbage
from registry.local import LocalStore
from registry.names import Ref, manifest_path
from registry.publish import publish_artefact
from registry.pull import pull_artefact
from registry.refs import promote
from tests.conftest import REPO_ROOT, run_cli
from tests.registry_helpers import (
    cli_json,
    file_digests,
    immutable,
    read_artefact,
    registry_env,
    tiny_files,
    write_artefact,
)


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "registry")


@pytest.fixture
def cache(tmp_path: Path) -> BlobCache:
    return BlobCache(tmp_path / "cache")


def test_round_trip_through_the_cli(tmp_path: Path) -> None:
    source = write_artefact(tmp_path / "build")
    artefact = read_artefact(source)
    env = registry_env(str(tmp_path / "registry"), tmp_path / "cache")

    published = cli_json("publish", str(source), env=env)
    assert published["created"] and published["uploaded_blobs"] == 3  # 4 files, two of them identical
    assert [(c["channel"], c["moved"]) for c in published["channels"]] == [("latest", True)]

    resolution = cli_json("resolve", "tiny-llama", "--target", "cpu", env=env)
    assert [(c["key"], c["status"]) for c in resolution["candidates"]] == [(artefact.key, "runnable")]
    assert resolution["chosen"]["key"] == artefact.key

    dest = tmp_path / "served"
    pulled = cli_json("pull", "tiny-llama", "--target", "cpu", "--dest", str(dest), env=env)
    paths = [f.path for f in artefact.files]
    assert file_digests(dest, paths) == {f.path: f.sha256 for f in artefact.files} == file_digests(source, paths)
    assert read_artefact(dest) == artefact
    assert pulled["downloaded_bytes"] == sum(f.size for f in artefact.files) - len(tiny_files()["tokenizer.json"])
    assert pulled["linked_files"] == 4
    weights = next(f for f in artefact.files if f.path == "model.safetensors")
    cached = tmp_path / "cache" / "blobs" / "sha256" / str(weights.sha256)
    assert (dest / "model.safetensors").stat().st_ino == cached.stat().st_ino  # a hard link, not a copy

    assert cli_json("ls", env=env) == [{"model": "tiny-llama", "artefacts": 1, "channels": {"latest": artefact.key},
                                       "foreign": 0}]
    shown = cli_json("show", f"tiny-llama@{artefact.key[:8]}", env=env)
    assert shown["key"] == artefact.key and shown["artefact"]["files"] == [f.model_dump() for f in artefact.files]

    table = run_cli("resolve", "tiny-llama", "--target", "cpu", env=env)
    assert table.returncode == 0 and "runnable" in table.stdout and "chosen: tiny-llama@" in table.stdout


def test_resolve_exits_1_when_nothing_here_runs_the_model(tmp_path: Path) -> None:
    """A job gating on `enginesmith resolve` stops where no artefact of the model runs on the machine; the table
    still says why each one lost."""
    env = registry_env(str(tmp_path / "registry"), tmp_path / "cache")
    engine = write_artefact(tmp_path / "engine", kind="trtllm-engine", target="h100-sxm", target_sm=90,
                            versions={"tensorrt_llm": "1.2.1"})
    assert cli_json("publish", str(engine), env=env)["created"]
    refused = run_cli("resolve", "tiny-llama", "--target", "cpu", env=env)
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert "incompatible" in refused.stdout and "h100-sxm" in refused.stdout
    as_json = run_cli("resolve", "tiny-llama", "--target", "cpu", "--json", env=env)
    assert as_json.returncode == 1 and json.loads(as_json.stdout)["chosen"] is None
    missing = run_cli("resolve", "no-such-model", "--target", "cpu", env=env)
    assert missing.returncode != 0


def test_publishing_a_key_again_is_a_no_op(store: LocalStore, tmp_path: Path) -> None:
    source = write_artefact(tmp_path / "build")
    first = publish_artefact(store, source)
    manifest_file = store.root / manifest_path(first.model, first.key)
    before = manifest_file.read_bytes()

    again = publish_artefact(store, source)

    assert first.created and not again.created
    assert again.uploaded_blobs == 0 and again.uploaded_bytes == 0
    assert manifest_file.read_bytes() == before
    assert not again.channels[0].moved


def test_publish_uploads_only_the_blobs_the_registry_lacks(store: LocalStore, tmp_path: Path) -> None:
    publish_artefact(store, write_artefact(tmp_path / "a"))
    files = {**tiny_files(), "model.safetensors": b"other weights"}
    second = publish_artefact(store, write_artefact(tmp_path / "b", files=files, recipe="int4-awq"))
    assert second.uploaded_blobs == 1 and second.uploaded_bytes == len(b"other weights")
    assert second.reused_blobs == 2


def test_publish_keeps_the_validation_report_and_takes_its_key(store: LocalStore, tmp_path: Path) -> None:
    source = write_artefact(tmp_path / "a")
    artefact_key = json.loads((source / "artefact.json").read_text())["key"]
    report = {"comparison": {"candidate": {"max_output_throughput": 321.0}}, "gate": {"passed": True},
              "artefact_key": artefact_key, "key": "nightly-1"}
    result = publish_artefact(store, source, validation=report)
    assert load_manifest(store, "tiny-llama", "nightly-1").validation == report
    assert result.key == "nightly-1"


def test_one_key_per_manifest(store: LocalStore, tmp_path: Path) -> None:
    """#15 item 8: a manifest is stored under its artefact's key or its validation's. Publishing under another key,
    or with the report of another artefact, is refused; a stored manifest whose artefact key was edited by hand is
    refused by pull as damaged, like a size or digest mismatch."""
    source = write_artefact(tmp_path / "a")
    artefact_key = json.loads((source / "artefact.json").read_text())["key"]
    with pytest.raises(UserError, match="neither its artefact's"):
        publish_artefact(store, source, key="anything-else")
    with pytest.raises(UserError, match="validation report is of artefact"):
        publish_artefact(store, source, validation={"artefact_key": "f" * 64, "key": "v" * 64})
    published = publish_artefact(store, source, validation={"artefact_key": artefact_key, "key": "v" * 64})
    assert published.key == "v" * 64

    path = tmp_path / "registry" / "manifests" / "tiny-llama" / f"{'v' * 64}.json"
    edited = json.loads(path.read_text())
    edited["artefact"]["key"] = "e" * 64
    path.write_text(json.dumps(edited))
    with pytest.raises(IntegrityError, match="damaged: its validation report is of artefact"):
        load_manifest(store, "tiny-llama", "v" * 64)
    pulled = run_cli("pull", f"tiny-llama@{'v' * 64}", "--target", "cpu", "--dest", str(tmp_path / "pulled"),
                     env=registry_env(str(tmp_path / "registry"), tmp_path / "cache"))
    assert pulled.returncode != 0 and "damaged" in pulled.stderr, pulled.stderr
    assert not (tmp_path / "pulled").exists()


def test_latest_follows_the_newest_and_promote_moves_a_channel(store: LocalStore, tmp_path: Path) -> None:
    older = publish_artefact(store, write_artefact(tmp_path / "a"))
    newer = publish_artefact(store, write_artefact(tmp_path / "b", files=tiny_files(seed=1)))
    assert find_manifest(store, Ref("tiny-llama", channel="latest")).key == newer.key

    publish_artefact(store, write_artefact(tmp_path / "a"))  # a re-publish of the older one
    assert find_manifest(store, Ref("tiny-llama", channel="latest")).key == newer.key

    change = promote(store, load_manifest(store, "tiny-llama", older.key), "stable")
    assert change.moved and change.previous is None
    assert find_manifest(store, Ref("tiny-llama", channel="stable")).key == older.key


def test_a_ref_moves_only_from_the_state_the_writer_saw(store: LocalStore, tmp_path: Path) -> None:
    result = publish_artefact(store, write_artefact(tmp_path / "a"))
    seen = store.read_ref("tiny-llama", "latest")
    assert seen is not None
    assert store.write_ref("tiny-llama", "latest", "someone-else", expected=seen)
    assert not store.write_ref("tiny-llama", "latest", result.key, expected=seen)  # stale: refused
    assert not store.write_ref("tiny-llama", "latest", result.key, expected=None)  # exists: refused
    current = store.read_ref("tiny-llama", "latest")
    assert current is not None and current.key == "someone-else"


def test_a_key_prefix_must_be_unambiguous(store: LocalStore, tmp_path: Path) -> None:
    publish_artefact(store, write_artefact(tmp_path / "a", key="abcdef01" + "0" * 56))
    publish_artefact(store, write_artefact(tmp_path / "b", files=tiny_files(seed=2), key="abcdef02" + "0" * 56))
    assert find_manifest(store, Ref("tiny-llama", key="abcdef02")).key == "abcdef02" + "0" * 56
    with pytest.raises(Exception, match="matches 2 artefacts"):
        find_manifest(store, Ref("tiny-llama", key="abcdef"))
    with pytest.raises(NotFoundError, match="no artefact"):
        find_manifest(store, Ref("tiny-llama", key="ffffff"))


def test_a_second_pull_comes_from_the_cache(store: LocalStore, cache: BlobCache, tmp_path: Path) -> None:
    publish_artefact(store, write_artefact(tmp_path / "a"))
    manifest = find_manifest(store, Ref("tiny-llama", channel="latest"))
    pull_artefact(store, manifest, dest=tmp_path / "one", cache=cache)

    dry = pull_artefact(store, manifest, dest=tmp_path / "two", cache=cache, dry_run=True)
    assert dry.plan.bytes_to_fetch == 0 and not (tmp_path / "two").exists()

    second = pull_artefact(store, manifest, dest=tmp_path / "two", cache=cache)
    assert second.downloaded_bytes == 0 and second.cached_bytes == sum(b.size for b in second.plan.blobs)


def test_a_dry_run_fetches_and_writes_nothing(store: LocalStore, cache: BlobCache, tmp_path: Path) -> None:
    publish_artefact(store, write_artefact(tmp_path / "a"))
    manifest = find_manifest(store, Ref("tiny-llama", channel="latest"))
    result = pull_artefact(store, manifest, dest=tmp_path / "dest", cache=cache, dry_run=True)
    assert result.plan.bytes_to_fetch == manifest.total_bytes - len(tiny_files()["tokenizer.json"])
    assert {b.state for b in result.plan.blobs} == {"missing"}
    assert not (tmp_path / "dest").exists() and not cache.root.exists()


def test_pull_replaces_only_a_directory_it_wrote(store: LocalStore, cache: BlobCache, tmp_path: Path) -> None:
    publish_artefact(store, write_artefact(tmp_path / "a"))
    manifest = find_manifest(store, Ref("tiny-llama", channel="latest"))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(Exception, match="not written by enginesmith pull"):
        pull_artefact(store, manifest, dest=foreign, cache=cache)
    assert (foreign / "notes.txt").read_text() == "mine"

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked = tmp_path / "linked"
    linked.symlink_to(elsewhere)
    with pytest.raises(Exception, match="symbolic link"):
        pull_artefact(store, manifest, dest=linked, cache=cache)
    assert list(elsewhere.iterdir()) == []

    ours = tmp_path / "ours"
    pull_artefact(store, manifest, dest=ours, cache=cache)
    (ours / "stray.txt").write_text("left over")
    pull_artefact(store, manifest, dest=ours, cache=cache)
    assert not (ours / "stray.txt").exists() and (ours / "config.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ours")] == []  # no staging left behind


def test_gc_keeps_the_newest_per_cell_and_everything_a_channel_names(store: LocalStore, tmp_path: Path) -> None:
    shared_config = tiny_files()["config.json"]
    keys = []
    for version in range(4):
        files = {"config.json": shared_config, "model.safetensors": f"weights v{version}".encode()}
        keys.append(publish_artefact(store, write_artefact(tmp_path / f"v{version}", files=files)).key)
    other_cell = publish_artefact(store, write_artefact(tmp_path / "awq", recipe="int4-awq")).key
    promote(store, load_manifest(store, "tiny-llama", keys[0]), "stable")
    orphan = hashlib.sha256(b"left by a killed publish").hexdigest()
    (tmp_path / "orphan").write_bytes(b"left by a killed publish")
    store.put_blob(orphan, tmp_path / "orphan")
    assert store.create_history("tiny-llama", "night-1", b"{}")  # the history is no artefact: gc leaves it

    dry = collect_garbage(store, keep_last=2, grace_s=0, dry_run=True)
    assert dry.deleted_manifests == [f"tiny-llama@{keys[1]}"]
    assert len(store.list_manifest_keys("tiny-llama")) == 5  # nothing deleted yet

    within_grace = collect_garbage(store, keep_last=2, grace_s=3600)
    assert within_grace.deleted_manifests == [f"tiny-llama@{keys[1]}"]
    assert within_grace.deleted_blobs == 0 and within_grace.young_unreferenced_blobs == 2  # v1's weights, orphan

    after_grace = collect_garbage(store, keep_last=2, grace_s=0)
    assert after_grace.deleted_manifests == [] and after_grace.deleted_blobs == 2
    assert sorted(store.list_manifest_keys("tiny-llama")) == sorted([keys[0], keys[2], keys[3], other_cell])
    remaining = {b.digest for b in store.list_blobs()}
    assert orphan not in remaining
    assert hashlib.sha256(b"weights v1").hexdigest() not in remaining
    assert hashlib.sha256(shared_config).hexdigest() in remaining  # still used by the survivors
    assert store.list_history("tiny-llama") == ["night-1"] and store.read_history("tiny-llama", "night-1") == b"{}"
    for key in (keys[0], keys[2], keys[3], other_cell):
        manifest = load_manifest(store, "tiny-llama", key)
        assert set(manifest.files_by_digest()) <= remaining


def test_gc_refuses_to_run_beside_an_unreadable_manifest(store: LocalStore, tmp_path: Path) -> None:
    source = write_artefact(tmp_path / "a")
    publish_artefact(store, source)
    (store.root / manifest_path("tiny-llama", "damaged")).write_text("{not json")
    blobs_before = sorted(b.digest for b in store.list_blobs())
    with pytest.raises(IntegrityError, match="cannot be read"):
        collect_garbage(store, grace_s=0)
    assert sorted(b.digest for b in store.list_blobs()) == blobs_before



def test_gc_spares_an_artefact_promoted_after_it_listed_the_registry_and_its_blobs(
    store: LocalStore, tmp_path: Path
) -> None:
    keys = [publish_artefact(store, write_artefact(
        tmp_path / f"v{version}", files={"config.json": b"{}", "model.safetensors": f"weights v{version}".encode()}
    )).key for version in range(3)]
    doomed = load_manifest(store, "tiny-llama", keys[0])  # the oldest: beyond keep_last=2, on no channel

    class PromotedMidway(LocalStore):
        """The registry, with someone promoting the oldest build once gc has listed the manifests (gc lists the
        blobs next, before it deletes anything)."""

        def list_blobs(self):  # type: ignore[no-untyped-def]
            promote(self, doomed, "stable")
            return super().list_blobs()

    swept = collect_garbage(PromotedMidway(store.root), keep_last=2, grace_s=0)

    assert swept.deleted_manifests == [] and swept.deleted_blobs == 0
    kept = load_manifest(store, "tiny-llama", keys[0])
    assert set(kept.files_by_digest()) <= {b.digest for b in store.list_blobs()}
    assert find_manifest(store, Ref(model="tiny-llama", channel="stable")).key == keys[0]

def test_a_bundle_carries_artefacts_to_an_air_gapped_pull(tmp_path: Path) -> None:
    source = write_artefact(tmp_path / "build")
    artefact = read_artefact(source)
    env = registry_env(str(tmp_path / "registry"), tmp_path / "cache")
    published = run_cli("publish", str(source), env=env)  # the human output, progress bars included
    assert published.returncode == 0 and f"published tiny-llama@{artefact.key[:12]}" in published.stdout
    bundle_file = tmp_path / "carry" / "tiny.tar"
    bundled = cli_json("bundle", "tiny-llama:latest", "--out", str(bundle_file), env=env)
    assert bundled["blobs"] == 3 and bundled["refs"] == {"tiny-llama:latest": artefact.key}
    with tarfile.open(bundle_file) as tar:
        blob_members = [n for n in tar.getnames() if n.startswith("blobs/")]
    assert len(blob_members) == len(set(blob_members)) == 3

    air_gapped = registry_env(str(tmp_path / "no-registry"), tmp_path / "other-cache")
    dest = tmp_path / "served"
    pulled = run_cli("pull", "tiny-llama:latest", "--from-bundle", str(bundle_file), "--dest", str(dest),
                     env=air_gapped)
    assert pulled.returncode == 0 and f"pulled tiny-llama@{artefact.key[:12]} → {dest}" in pulled.stdout
    paths = [f.path for f in artefact.files]
    assert file_digests(dest, paths) == file_digests(source, paths)
    assert not (tmp_path / "no-registry").exists()


def test_a_damaged_bundle_fails_the_pull_naming_the_file(store: LocalStore, tmp_path: Path) -> None:
    publish_artefact(store, write_artefact(tmp_path / "a"))
    manifest = find_manifest(store, Ref("tiny-llama", channel="latest"))
    bundle_file = tmp_path / "tiny.tar"
    write_bundle(store, [manifest], bundle_file)
    weights = next(f for f in manifest.artefact.files if f.path == "model.safetensors")
    offset = BundleStore(bundle_file)._members[f"blobs/sha256/{weights.sha256}"][0] + 1000
    with bundle_file.open("r+b") as handle:
        handle.seek(offset)
        original = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([original[0] ^ 0xFF]))

    with pytest.raises(IntegrityError, match=r"model\.safetensors"):
        pull_artefact(BundleStore(bundle_file), manifest, dest=tmp_path / "dest", cache=BlobCache(tmp_path / "c"))
    assert not (tmp_path / "dest").exists()


def test_user_errors_say_what_to_do(tmp_path: Path) -> None:
    (tmp_path / "registry").mkdir()
    env = registry_env(str(tmp_path / "registry"), tmp_path / "cache")
    missing = run_cli("pull", "no-such-model", env=env)
    assert missing.returncode == 2 and "no artefact of no-such-model" in missing.stderr
    bad_ref = run_cli("show", "tiny-llama@../x", env=env)
    assert bad_ref.returncode == 2 and "MODEL@KEY" in bad_ref.stderr
    bad_scheme = run_cli("ls", "--registry", "ftp://example/registry", env=env)
    assert bad_scheme.returncode == 2 and "s3://bucket/prefix" in bad_scheme.stderr
    not_an_artefact = run_cli("publish", str(tmp_path), env=env)
    assert not_an_artefact.returncode == 2 and "artefact.json" in not_an_artefact.stderr
    assert "Traceback" not in missing.stderr + bad_ref.stderr + bad_scheme.stderr + not_an_artefact.stderr


def test_listing_reports_an_unreadable_manifest_and_resolve_skips_it(store: LocalStore, tmp_path: Path) -> None:
    good = publish_artefact(store, write_artefact(tmp_path / "a"))
    document = json.loads(load_manifest(store, "tiny-llama", good.key).to_bytes())
    document["key"] = "evil"
    document["artefact"]["files"][0]["path"] = "../../outside.txt"
    (store.root / manifest_path("tiny-llama", "evil")).write_text(json.dumps(document))

    listing = list_model(store, "tiny-llama")
    assert [m.key for m in listing.manifests] == [good.key]
    assert [u.key for u in listing.unreadable] == ["evil"] and "'..'" in listing.unreadable[0].problem
    assert os.listdir(store.root / "manifests" / "tiny-llama")  # nothing was deleted or rewritten


@pytest.mark.parametrize(("url", "meant"), [("oci:127.0.0.1:5000/engines", "oci://127.0.0.1:5000/engines"),
                                            ("oci+http:/127.0.0.1:5000/engines", "oci+http://127.0.0.1:5000/engines"),
                                            ("s3:engines/fleet", "s3://engines/fleet"),
                                            ("file:/srv/registry", "file:///srv/registry"),
                                            ("s3//engines/fleet", "s3://engines/fleet"),
                                            ("oci//127.0.0.1:5000/engines", "oci://127.0.0.1:5000/engines")])
def test_a_registry_url_missing_its_slashes_is_an_error_not_an_empty_local_registry(url: str, meant: str,
                                                                                     tmp_path: Path,
                                                                                     monkeypatch) -> None:
    """#52: `oci:host:port/ns` was read as a local directory and listed nothing with rc 0."""
    from registry.store import open_store

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as refused:
        open_store(url)
    assert refused.value.where == "--registry" and meant in refused.value.render()
    assert not any(tmp_path.iterdir())  # nothing created where the URL would have been a directory
    named = tmp_path / "oci:a-directory"
    named.mkdir()
    assert isinstance(open_store(str(named.relative_to(tmp_path))), LocalStore)  # a directory may be named so


def test_a_registry_that_does_not_exist_is_an_error_not_an_empty_listing(tmp_path: Path) -> None:
    """#62: `ls --registry /no/such/dir` printed an empty table with rc 0; ENGINESMITH_REGISTRY=s3//b/p was read as
    the local directory s3/b/p."""
    missing = tmp_path / "no" / "such" / "dir"
    listed = run_cli("ls", "--registry", str(missing), env=registry_env(str(tmp_path / "unused"), tmp_path / "cache"))
    assert listed.returncode == 2, listed.stdout + listed.stderr
    assert listed.stderr.startswith(f"error: --registry: no registry at {missing}: the directory does not exist")
    assert listed.stdout == "" and "Traceback" not in listed.stderr
    misspelt = run_cli("ls", env=registry_env("s3//engines/fleet", tmp_path / "cache"))
    assert misspelt.returncode == 2, misspelt.stdout + misspelt.stderr
    assert "ENGINESMITH_REGISTRY: 's3//engines/fleet' has no ':' after its scheme s3" in misspelt.stderr
    assert "write s3://engines/fleet" in misspelt.stderr
    no_bundle = run_cli("pull", "tiny-llama", "--from-bundle", str(tmp_path / "node.bundle"),
                        env={"ENGINESMITH_CACHE_DIR": str(tmp_path / "cache")})
    assert no_bundle.returncode == 2 and no_bundle.stderr.startswith(
        f"error: --from-bundle: {tmp_path / 'node.bundle'} does not exist"), no_bundle.stderr
    assert not (REPO_ROOT / "s3").exists() and not (tmp_path / "cache").exists()


def test_copy_from_a_registry_that_does_not_exist_is_an_error_and_creates_no_destination(tmp_path: Path) -> None:
    """#62: `copy /no/such/dir DST` said "copied 0 artefact(s)" with rc 0."""
    copied = run_cli("copy", str(tmp_path / "no-such-dir"), str(tmp_path / "destination"),
                     env={"ENGINESMITH_CACHE_DIR": str(tmp_path / "cache")})
    assert copied.returncode == 2, copied.stdout + copied.stderr
    assert copied.stderr.startswith(f"error: SOURCE: no registry at {tmp_path / 'no-such-dir'}")
    assert "copied" not in copied.stdout and sorted(p.name for p in tmp_path.iterdir()) == []


def test_copy_into_a_directory_that_cannot_be_written_says_so_in_one_line(tmp_path: Path) -> None:
    """#62: a copy into a directory that cannot be written ended in three chained tracebacks, rc 1. A path under a
    file fails for root too; an immutable directory (where chattr works) is the permission case."""
    source = LocalStore(tmp_path / "source")
    publish_artefact(source, write_artefact(tmp_path / "build"))
    env = {"ENGINESMITH_CACHE_DIR": str(tmp_path / "cache")}
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    under_a_file = run_cli("copy", str(source.root), str(blocker / "registry"), env=env)
    assert under_a_file.returncode == 2 and "Traceback" not in under_a_file.stderr, under_a_file.stderr
    assert under_a_file.stderr.startswith(f"error: DESTINATION: {blocker / 'registry'} cannot be a registry "
                                          f"directory: {blocker} is a file")
    locked = tmp_path / "locked"
    locked.mkdir()
    with immutable(locked):
        refused = run_cli("copy", str(source.root), str(locked / "registry"), env=env)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    first_line = refused.stderr.splitlines()[0]
    assert first_line.startswith(f"error: {locked / 'registry'}: writing blob sha256:") and "failed:" in first_line
    assert list(locked.iterdir()) == []


def test_an_s3_endpoint_without_its_scheme_is_named_with_where_it_came_from(tmp_path: Path) -> None:
    """#62: AWS_ENDPOINT_URL=127.0.0.1:9 (or --s3-endpoint localhost:9) raised boto3's bare `ValueError: Invalid
    endpoint`, rc 1."""
    env = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_ENDPOINT_URL": "127.0.0.1:9",
           "ENGINESMITH_CACHE_DIR": str(tmp_path / "cache")}
    from_environment = run_cli("ls", "--registry", "s3://engines/fleet", env=env)
    from_flag = run_cli("ls", "--registry", "s3://engines/fleet", "--s3-endpoint", "localhost:9",
                        env={**env, "AWS_ENDPOINT_URL": ""})
    for done, given_by, endpoint in ((from_environment, "AWS_ENDPOINT_URL", "127.0.0.1:9"),
                                     (from_flag, "--s3-endpoint", "localhost:9")):
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith(f"error: {given_by}: the S3 endpoint '{endpoint}' is not an http:// or https:// "
                                      "URL with a host"), done.stderr
        assert f"e.g. http://{endpoint}" in done.stderr



def test_an_os_error_no_command_names_itself_is_still_one_line_with_its_path(tmp_path: Path) -> None:
    """#62: an OSError a command does not turn into its own message (here `bundle --out` under a file) is one line
    naming the path, exit 2; --debug shows the traceback."""
    store = LocalStore(tmp_path / "registry")
    publish_artefact(store, write_artefact(tmp_path / "build"))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    args = ("bundle", "tiny-llama", "--registry", str(store.root), "--out", str(blocker / "node.bundle"))
    failed = run_cli(*args)
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    assert f"error: enginesmith bundle failed: File exists: {blocker}\n" in failed.stderr, failed.stderr
    assert blocker.read_text() == "not a directory"
    assert "Traceback" in run_cli("--debug", *args).stderr
