"""#52: ``enginesmith copy`` carries artefacts between registries as they are, so a staging registry promotes into
production and a mirror verifies with the same trust file: local → local (fast), local → S3 and local → OCI (slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from registry.cache import BlobCache
from registry.catalog import list_model, load_manifest
from registry.channel_statements import ChannelSigner
from registry.copy import copy_artefacts, copy_selection
from registry.local import TMP_DIR, LocalStore
from registry.publish import publish_artefact
from registry.refs import promote
from registry.signing import load_signing_key, load_trust
from registry.store import RegistryStore, open_store
from registry.withdrawals import withdraw
from tests.conftest import run_cli, write_key_pair
from tests.registry_helpers import (
    MIB,
    big_files,
    cli_json,
    file_digests,
    open_store_of_kind,
    read_artefact,
    registry_env,
    start_cli,
    tiny_files,
    write_artefact,
)
from tests.waiting import kill_when


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow),
                        pytest.param("oci", marks=pytest.mark.slow)])
def destination(request: pytest.FixtureRequest, tmp_path: Path) -> RegistryStore:
    return open_store_of_kind(request, request.param, tmp_path, "production")


def test_a_copy_carries_blobs_manifests_withdrawals_and_history_not_statements_and_a_pull_verifies_there(
    destination: RegistryStore, tmp_path: Path
) -> None:
    nightly = load_signing_key(key_file=write_key_pair(tmp_path / "keys", "nightly"))
    staging = open_store(str(tmp_path / "staging"))
    built = [publish_artefact(staging, write_artefact(tmp_path / name, files=tiny_files(seed=seed)),
                              signing_key=nightly) for name, seed in (("old", 1), ("new", 2))]
    old, new = (load_manifest(staging, "tiny-llama", b.key) for b in built)
    promote(staging, new, "prod", signer=ChannelSigner(staging, nightly))
    withdraw(staging, "tiny-llama", old.key, "wrong tokenizer", nightly)

    manifests, channels = copy_selection(staging, ["tiny-llama"])
    copied = copy_artefacts(staging, destination, manifests, channels, BlobCache(tmp_path / "cache"))
    assert sorted(copied.artefacts) == sorted([old.ref, new.ref]) and copied.blobs_copied == 8
    assert {(c.channel, c.moved) for c in copied.channels} == {("latest", True), ("prod", True)}
    assert all("were not copied" in c.note for c in copied.channels)  # statements name the registry they were made in
    for manifest in (old, new):  # byte for byte: dates, signatures, reports
        assert destination.read_manifest("tiny-llama", manifest.key) == staging.read_manifest("tiny-llama",
                                                                                                manifest.key)
    assert destination.list_history("tiny-llama") == [e for e in staging.list_history("tiny-llama")
                                                      if not e.startswith("statement-")]
    assert list_model(destination, "tiny-llama").channels == list_model(staging, "tiny-llama").channels

    again = copy_artefacts(staging, destination, manifests, channels, BlobCache(tmp_path / "cache"))
    assert (again.artefacts, again.blobs_copied, again.history_records) == ([], 0, 0)
    assert sorted(again.present) == sorted([old.ref, new.ref])

    from registry.choose import choose
    from registry.machine import describe_machine
    from registry.names import parse_ref
    from registry.pull import pull_artefact
    from registry.resolve import Constraints

    trust_path = tmp_path / "trust.yaml"
    trust_path.write_text(f"keys: {{nightly: {tmp_path}/keys/nightly.pub}}\nchannels: {{prod: [nightly]}}\n")
    trust = load_trust([trust_path])
    promote(destination, load_manifest(destination, "tiny-llama", new.key), "prod",
            signer=ChannelSigner(destination, nightly))  # vouched for where it is served, by its own statement
    pulled = pull_artefact(destination, load_manifest(destination, "tiny-llama", new.key), dest=tmp_path / "served",
                           cache=BlobCache(tmp_path / "pull-cache"), trust=trust, channel="prod")
    assert pulled.signature is not None and pulled.signature.signer == "nightly"
    bare = choose(destination, parse_ref("tiny-llama"), describe_machine("cpu"), Constraints(), trust)
    assert bare.manifest.key == new.key  # the withdrawal came along


def test_a_channel_promoted_in_the_destination_on_its_own_is_not_moved_by_a_copy(tmp_path: Path) -> None:
    nightly = load_signing_key(key_file=write_key_pair(tmp_path / "keys", "nightly"))
    staging, production = open_store(str(tmp_path / "staging")), open_store(str(tmp_path / "production"))
    built = [publish_artefact(staging, write_artefact(tmp_path / name, files=tiny_files(seed=seed)),
                              signing_key=nightly) for name, seed in (("old", 1), ("new", 2))]
    old, new = (load_manifest(staging, "tiny-llama", b.key) for b in built)
    copy_artefacts(staging, production, [old], {}, BlobCache(tmp_path / "cache"))
    promote(production, load_manifest(production, "tiny-llama", old.key), "prod",
            signer=ChannelSigner(production, nightly))
    promote(staging, new, "prod", signer=ChannelSigner(staging, nightly))
    copied = copy_artefacts(staging, production, [new], {"tiny-llama:prod": new.key}, BlobCache(tmp_path / "cache"))
    (prod,) = copied.channels
    assert not prod.moved and "the destination has its own signed statements" in prod.why_not
    ref = production.read_ref("tiny-llama", "prod")
    assert ref is not None and ref.key == old.key


def test_the_copy_command_names_what_it_copied_and_refuses_a_registry_onto_itself(tmp_path: Path) -> None:
    staging = open_store(str(tmp_path / "staging"))
    publish_artefact(staging, write_artefact(tmp_path / "build"))
    env = registry_env(str(tmp_path / "staging"), tmp_path / "cache")
    done = run_cli("copy", str(tmp_path / "staging"), str(tmp_path / "production"), "tiny-llama:latest", env=env)
    assert done.returncode == 0, done.stderr
    assert "copied 1 artefact(s)" in done.stdout and "tiny-llama:latest →" in done.stdout
    same = run_cli("copy", str(tmp_path / "staging"), str(tmp_path / "staging"), env=env)
    assert same.returncode == 2 and "the same registry" in same.stderr


def test_a_destination_holding_another_manifest_under_the_same_key_is_an_error(tmp_path: Path) -> None:
    from registry.errors import IntegrityError

    staging, production = open_store(str(tmp_path / "staging")), open_store(str(tmp_path / "production"))
    published = publish_artefact(staging, write_artefact(tmp_path / "build"))
    manifest = load_manifest(staging, "tiny-llama", published.key)
    other = manifest.model_copy(update={"published": "2026-01-01T00:00:00+00:00"})
    assert production.create_manifest("tiny-llama", manifest.key, other.to_bytes())
    with pytest.raises(IntegrityError, match="holds another manifest under tiny-llama@"):
        copy_artefacts(staging, production, [manifest], {}, BlobCache(tmp_path / "cache"))
    assert production.read_manifest("tiny-llama", manifest.key) == other.to_bytes()  # left as it was
    assert list(production.list_blobs()) == []  # refused before a blob was copied


def test_a_copy_killed_half_way_continues_from_the_bytes_the_destination_kept(tmp_path: Path) -> None:
    """#62: a killed local copy left its blob's temporary file in the destination, and the next run wrote the blob
    again from its first byte. The rerun now takes the killed run's partial file over and sends only the rest."""
    files = {"weights.safetensors": big_files(8 * MIB, parts=1)["rank0.safetensors"], **tiny_files()}
    source = write_artefact(tmp_path / "build", files=files)
    staging = LocalStore(tmp_path / "staging")
    publish_artefact(staging, source)
    weights = next(f for f in read_artefact(source).files if f.path == "weights.safetensors")
    production = LocalStore(tmp_path / "production")
    env = registry_env(str(staging.root), tmp_path / "cache")
    log = tmp_path / "copy.log"
    # 16 MiB/s writes ~800 KiB slices: the weights sit part-written in the destination for half a second.
    copier = start_cli("copy", str(staging.root), str(production.root), "--jobs", "1", "--limit-rate", "16M",
                       env=env, log=log)
    kill_when(copier, lambda: 2 * MIB <= production.uploads.partial_bytes(str(weights.sha256)) < weights.size,
              "at least 2 MiB, not all, of the weights in the destination's partial file", timeout_s=60, log=log)
    kept = production.uploads.partial_bytes(str(weights.sha256))
    assert production.list_manifest_keys("tiny-llama") == []
    whole_before = sum(info.size for info in production.list_blobs())  # the blobs copied before the weights

    resumed = cli_json("copy", str(staging.root), str(production.root), env=env)

    assert resumed["resumed_bytes"] == kept
    all_blobs = sum(info.size for info in staging.list_blobs())
    assert resumed["bytes_copied"] == all_blobs - whole_before - kept
    assert list((production.root / TMP_DIR).iterdir()) == []  # the killed run's file was taken over
    served = tmp_path / "served"
    cli_json("pull", "tiny-llama", "--dest", str(served), env=registry_env(str(production.root), tmp_path / "fresh"))
    artefact = read_artefact(source)
    assert file_digests(served, [f.path for f in artefact.files]) == {f.path: f.sha256 for f in artefact.files}
