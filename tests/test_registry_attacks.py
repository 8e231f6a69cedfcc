"""Signed channel statements (#52): what an attacker with write access to the registry's storage does to a channel,
and how a ``--trust`` pull refuses it, with nothing written to the destination.

The attacker acts through the storage itself (the store's own calls, or deleting a record as one would with the
bucket's or registry's API): it can move pointers, delete and rewrite records, and copy statements, but it holds no
trusted private key. Each attack runs on a local registry (fast) and on S3 (SeaweedFS) and OCI (docker-registry),
slow tier.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from enginesmith.core.errors import UserError
from registry.cache import BlobCache
from registry.catalog import find_manifest, load_manifest
from registry.channel_statements import (
    ChannelRaceError,
    ChannelSigner,
    ChannelStatementError,
    newest_claim,
    statement_entry,
    statement_sequences,
)
from registry.errors import SignatureError
from registry.gc import collect_garbage
from registry.history import load_history
from registry.manifest import Manifest
from registry.names import parse_ref
from registry.publish import publish_artefact
from registry.pull import pull_artefact
from registry.refs import promote
from registry.signing import SigningKey, Trust, load_signing_key, load_trust
from registry.store import RegistryStore, open_store
from tests.conftest import run_cli, write_key_pair
from tests.registry_helpers import open_store_of_kind, read_artefact, registry_env, tiny_files, write_artefact

pytest.importorskip("model_signing", reason="needs model-signing (part of the base install)")


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow),
                        pytest.param("oci", marks=pytest.mark.slow)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> RegistryStore:
    return open_store_of_kind(request, request.param, tmp_path, "statements")


@pytest.fixture(scope="module")
def key_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("keys")
    for name in ("nightly", "laptop"):
        write_key_pair(directory, name)
    return directory


@pytest.fixture(scope="module")
def signing(key_dir: Path) -> dict[str, SigningKey]:
    return {name: load_signing_key(key_file=key_dir / f"{name}.key") for name in ("nightly", "laptop")}


def trust_file(key_dir: Path, tmp_path: Path, extra: str = "") -> Trust:
    path = tmp_path / "trust.yaml"
    path.write_text(f"keys: {{nightly: {key_dir}/nightly.pub, laptop: {key_dir}/laptop.pub}}\n"
                    "channels: {prod: {signers: [nightly], expires: 7d}}\n" + extra)
    return load_trust([path])


def two_builds(store: RegistryStore, tmp_path: Path, key: SigningKey, model: str = "tiny-llama"
               ) -> tuple[Manifest, Manifest]:
    """An older and a newer build of ``model``, both genuinely signed."""
    built = []
    for name, seed in (("old", 1), ("new", 2)):
        source = write_artefact(tmp_path / f"{model}-{name}", model=model, files=tiny_files(seed=seed))
        result = publish_artefact(store, source, signing_key=key)
        built.append(load_manifest(store, result.model, result.key))
    return built[0], built[1]


def pull_channel(store: RegistryStore, channel: str, trust: Trust, dest: Path, model: str = "tiny-llama"):
    manifest = find_manifest(store, parse_ref(f"{model}:{channel}"))
    return pull_artefact(store, manifest, dest=dest, cache=BlobCache(dest.parent / "cache"), trust=trust,
                         channel=channel)


def refused(store: RegistryStore, channel: str, trust: Trust, dest: Path) -> ChannelStatementError:
    with pytest.raises(ChannelStatementError) as caught:
        pull_channel(store, channel, trust, dest)
    assert not dest.exists()
    return caught.value


def delete_record(store: RegistryStore, model: str, entry: str) -> None:
    """The attacker deletes a history record through the storage's own API (no enginesmith call deletes one)."""
    from registry.local import LocalStore
    from registry.names import history_path
    from registry.oci import OciStore
    from registry.s3 import S3Store

    if isinstance(store, LocalStore):
        (store.root / history_path(model, entry)).unlink()
    elif isinstance(store, S3Store):
        store._client.delete_object(Bucket=store.bucket, Key=store._key(history_path(model, entry)))
    else:
        assert isinstance(store, OciStore)
        store._delete_tagged(store._repo("history", model), entry)


def point(store: RegistryStore, model: str, channel: str, key: str) -> None:
    """The attacker moves a pointer by hand (no statement: it holds no trusted key)."""
    assert store.write_ref(model, channel, key, expected=store.read_ref(model, channel))


# --- the attacks ---------------------------------------------------------------------------------------------------


def test_a_channel_moved_back_by_hand_is_refused_and_so_is_one_rolled_back_with_its_statements(
    store: RegistryStore, signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    old, new = two_builds(store, tmp_path, signing["nightly"])
    trust = trust_file(key_dir, tmp_path)
    nightly = ChannelSigner(store, signing["nightly"])
    assert promote(store, old, "prod", signer=nightly).statement == 1
    assert promote(store, new, "prod", signer=nightly).statement == 2
    pulled = pull_channel(store, "prod", trust, tmp_path / "genuine")  # this node has now seen statement 2
    assert Path(pulled.dest).is_dir()

    point(store, "tiny-llama", "prod", old.key)  # the pointer alone, to an older genuinely signed build
    moved = refused(store, "prod", trust, tmp_path / "moved")
    assert moved.check.failed == "not-the-pointer" and moved.check.claim is not None
    assert moved.check.claim.sequence == 2 and old.key[:12] in str(moved.check.detail)

    delete_record(store, "tiny-llama", statement_entry("prod", 2))  # and the statement that named the newer one
    rolled = refused(store, "prod", trust, tmp_path / "rolled")
    assert rolled.check.failed == "rolled-back" and "seen 2" in rolled.check.detail


def test_a_future_publication_time_holds_neither_latest_nor_a_trusted_pull(
    store: RegistryStore, signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    source = write_artefact(tmp_path / "first", files=tiny_files(seed=1))
    first = load_manifest(store, "tiny-llama", publish_artefact(store, source, signing_key=signing["nightly"]).key)
    forged = first.model_copy(update={"published": "2099-01-01T00:00:00+00:00"})
    store.delete_manifest("tiny-llama", first.key)  # the attacker rewrites the record's unsigned-looking field
    assert store.create_manifest("tiny-llama", first.key, forged.to_bytes())
    if store.read_ref("tiny-llama", "latest") is None:  # OCI deletes a manifest's tags with it: point latest again
        assert store.write_ref("tiny-llama", "latest", first.key, expected=None)

    later = publish_artefact(store, write_artefact(tmp_path / "later", files=tiny_files(seed=2)),
                             signing_key=signing["nightly"])
    (latest,) = later.channels
    assert latest.moved and latest.key == later.key and latest.future_dated == first.key
    with pytest.raises(SignatureError, match=r"over other content: \.enginesmith-publication\.json differs"):
        pull_artefact(store, load_manifest(store, "tiny-llama", first.key), dest=tmp_path / "dest",
                      cache=BlobCache(tmp_path / "cache"), trust=trust_file(key_dir, tmp_path))
    assert not (tmp_path / "dest").exists()


def test_a_future_publication_time_does_not_make_gc_keep_an_old_build_over_newer_ones(
    signing: dict[str, SigningKey], tmp_path: Path
) -> None:
    store = open_store(str(tmp_path / "registry"))
    built = [load_manifest(store, "tiny-llama", publish_artefact(
        store, write_artefact(tmp_path / f"b{seed}", files=tiny_files(seed=seed)), signing_key=signing["nightly"]).key)
        for seed in (1, 2, 3)]
    rewrite(store, built[0], published="2099-01-01T00:00:00+00:00")
    swept = collect_garbage(store, keep_last=2, dry_run=True)
    assert swept.deleted_manifests == []  # its time is not the one its signature covers: gc does not guess
    assert list(swept.unordered) == [built[0].ref] and "2099" in swept.unordered[built[0].ref]


def test_an_expired_statement_is_refused_as_a_frozen_channel(
    store: RegistryStore, signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    _, new = two_builds(store, tmp_path, signing["nightly"])
    eight_days_ago = datetime.now(timezone.utc) - timedelta(days=8)
    stale = ChannelSigner(store, signing["nightly"], timedelta(days=7), clock=lambda: eight_days_ago)
    promote(store, new, "prod", signer=stale)
    frozen = refused(store, "prod", trust_file(key_dir, tmp_path), tmp_path / "dest")
    assert frozen.check.failed == "expired" and "frozen" in frozen.check.detail
    promote(store, new, "prod", signer=ChannelSigner(store, signing["nightly"]))  # the promoter renews it
    assert Path(pull_channel(store, "prod", trust_file(key_dir, tmp_path), tmp_path / "dest").dest).is_dir()


def test_a_statement_replayed_from_another_model_or_channel_is_refused(
    store: RegistryStore, signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    nightly = ChannelSigner(store, signing["nightly"])
    _, ours = two_builds(store, tmp_path, signing["nightly"])
    _, theirs = two_builds(store, tmp_path, signing["nightly"], model="other-llama")
    promote(store, ours, "prod", signer=nightly)
    promote(store, theirs, "prod", signer=nightly)
    promote(store, ours, "canary", signer=nightly)
    trust = trust_file(key_dir, tmp_path)

    replayed = store.read_history("other-llama", statement_entry("prod", 1))
    assert replayed is not None and store.create_history("tiny-llama", statement_entry("prod", 2), replayed)
    mixed = refused(store, "prod", trust, tmp_path / "mixed")
    assert mixed.check.failed == "other-model-or-channel" and "other-llama:prod" in mixed.check.detail

    from_canary = store.read_history("tiny-llama", statement_entry("canary", 1))
    assert from_canary is not None and store.create_history("tiny-llama", statement_entry("prod", 3), from_canary)
    crossed = refused(store, "prod", trust, tmp_path / "crossed")
    assert crossed.check.failed == "other-model-or-channel" and "tiny-llama:canary" in crossed.check.detail


def test_a_statement_by_a_key_the_channel_does_not_allow_or_a_revoked_one_is_refused(
    store: RegistryStore, signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    _, new = two_builds(store, tmp_path, signing["nightly"])
    promote(store, new, "prod", signer=ChannelSigner(store, signing["laptop"]))  # trusted, but not for prod
    not_allowed = refused(store, "prod", trust_file(key_dir, tmp_path), tmp_path / "laptop")
    assert not_allowed.check.failed == "signer-not-allowed" and "allows nightly" in not_allowed.check.detail

    promote(store, new, "prod", signer=ChannelSigner(store, signing["nightly"]))
    revoked_at = new.published_at + timedelta(seconds=1)  # after the build was signed, before this statement
    later = ChannelSigner(store, signing["nightly"], clock=lambda: revoked_at + timedelta(minutes=1))
    promote(store, new, "prod", signer=later)
    trust = trust_file(key_dir, tmp_path, f"revoked: {{nightly: '{revoked_at.isoformat()}'}}\n")
    revoked = refused(store, "prod", trust, tmp_path / "revoked")
    assert revoked.check.failed == "revoked-signer" and "revoked" in revoked.check.detail
    with pytest.raises(SignatureError, match="revoked"):  # and the build, signed after it, by key
        pull_artefact(store, new, dest=tmp_path / "by-key", cache=BlobCache(tmp_path / "cache"),
                      trust=trust_file(key_dir, tmp_path, f"revoked: {{nightly: '{new.published}'}}\n"))
    assert not (tmp_path / "by-key").exists()


def test_an_unsigned_or_garbage_statement_is_read_past_and_a_channel_without_one_is_refused(
    store: RegistryStore, signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    _, new = two_builds(store, tmp_path, signing["nightly"])
    trust = trust_file(key_dir, tmp_path)
    promote(store, new, "prod")  # moved without a signing key
    missing = refused(store, "prod", trust, tmp_path / "none")
    assert missing.check.failed == "missing" and "sign-key" in (missing.hint or "")
    promote(store, new, "prod", signer=ChannelSigner(store, signing["nightly"]))
    assert store.create_history("tiny-llama", statement_entry("prod", 99), b'{"payload": "forged"}')
    pulled = pull_channel(store, "prod", trust, tmp_path / "dest")
    assert Path(pulled.dest).is_dir()  # statement 99 is no one's word; statement 1 is


# --- the promoters, the state, the store --------------------------------------------------------------------------


def test_two_promotes_racing_one_wins_the_other_fails_clearly_and_no_sequence_repeats(
    signing: dict[str, SigningKey], tmp_path: Path
) -> None:
    store = open_store(str(tmp_path / "registry"))
    old, new = two_builds(store, tmp_path, signing["nightly"])
    signed: list[int] = []
    lost: list[str] = []
    for _ in range(12):
        barrier = threading.Barrier(2)

        def race(manifest: Manifest, barrier: threading.Barrier = barrier) -> None:
            signer = ChannelSigner(open_store(str(tmp_path / "registry")), signing["nightly"])
            barrier.wait()
            try:
                change = promote(store, manifest, "prod", signer=signer)
            except ChannelRaceError as refused:
                lost.append(refused.message)
                return
            assert change.statement is not None
            signed.append(change.statement)

        threads = [threading.Thread(target=race, args=(m,)) for m in (old, new)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    sequences = statement_sequences(store, "tiny-llama", "prod")
    assert sequences == list(range(1, len(sequences) + 1))  # each written once, none skipped or repeated
    # A promoter that signed, then lost the pointer to the other, signs again: its first statement is superseded
    # (never the newest), and what each promoter reports is a statement the store holds.
    assert set(signed) <= set(sequences) and sequences[-1] in signed and len(set(signed)) == len(signed)
    assert len(signed) + len(lost) == 24 and all("moved nothing" in message for message in lost)
    claim = newest_claim(store, "tiny-llama", "prod")
    ref = store.read_ref("tiny-llama", "prod")
    assert claim is not None and ref is not None and claim.key == ref.key  # whoever moved last signed last


def test_a_promoter_that_read_the_sequence_before_another_wrote_it_fails_and_moves_nothing(
    signing: dict[str, SigningKey], tmp_path: Path
) -> None:
    """The race above, at its worst moment on purpose: B listed the statements before A wrote the next one."""
    store = open_store(str(tmp_path / "registry"))
    old, new = two_builds(store, tmp_path, signing["nightly"])

    class ListedBeforeA:  # B's view of the store: its listing of the history is from before A's statement
        def __init__(self, inner: RegistryStore) -> None:
            self.inner, self.listing = inner, inner.list_history("tiny-llama")

        def list_history(self, model: str) -> list[str]:
            return self.listing

        def __getattr__(self, name: str):
            return getattr(self.inner, name)

    b_view = ListedBeforeA(store)
    assert promote(store, old, "prod", signer=ChannelSigner(store, signing["nightly"])).statement == 1
    with pytest.raises(ChannelRaceError, match="moved nothing"):
        promote(b_view, new, "prod", signer=ChannelSigner(b_view, signing["nightly"]))  # type: ignore[arg-type]
    ref = store.read_ref("tiny-llama", "prod")
    assert ref is not None and ref.key == old.key and statement_sequences(store, "tiny-llama", "prod") == [1]


def test_a_promoter_that_signed_and_then_lost_the_pointer_signs_again_so_the_last_to_move_signed_last(
    signing: dict[str, SigningKey], tmp_path: Path
) -> None:
    """The race's other moment on purpose: B signed statement 2, then A's pointer write (under statement 1) landed
    before B's. B's statement 2 is superseded by its statement 3, which names where the pointer now is."""
    store = open_store(str(tmp_path / "registry"))
    old, new = two_builds(store, tmp_path, signing["nightly"])
    a_signer = ChannelSigner(store, signing["nightly"])
    a_claim = a_signer.sign("tiny-llama", "prod", old.key)
    assert a_claim is not None and a_claim.sequence == 1

    class AMovesFirst:  # B's view: A's pointer write lands between B's statement and B's own pointer write
        def __init__(self, inner: RegistryStore) -> None:
            self.inner, self.interposed = inner, False

        def write_ref(self, model: str, channel: str, key: str, *, expected: object) -> bool:
            if not self.interposed:
                self.interposed = True
                assert self.inner.write_ref(model, channel, old.key, expected=None)
            return self.inner.write_ref(model, channel, key, expected=expected)  # type: ignore[arg-type]

        def __getattr__(self, name: str):
            return getattr(self.inner, name)

    b_view = AMovesFirst(store)
    change = promote(b_view, new, "prod", signer=ChannelSigner(b_view, signing["nightly"]))  # type: ignore[arg-type]
    assert change.moved and change.previous == old.key and change.statement == 3
    assert statement_sequences(store, "tiny-llama", "prod") == [1, 2, 3]
    claim = newest_claim(store, "tiny-llama", "prod")
    assert claim is not None and claim.sequence == 3 and claim.key == new.key
    ref = store.read_ref("tiny-llama", "prod")
    assert ref is not None and ref.key == new.key


def test_a_promote_that_renews_a_kept_channel_while_another_move_lands_signs_again(
    signing: dict[str, SigningKey], tmp_path: Path
) -> None:
    """The fresh CI run's moment: prod is on the old build; B signed statement 2 (new) and its pointer write was
    still to land when A, promoting the old build again, renewed it as statement 3. B's move then lands. A's renewal
    is a compare-and-swap of the unchanged pointer, so A sees the move and signs again: the newest statement names
    where the pointer is."""
    store = open_store(str(tmp_path / "registry"))
    old, new = two_builds(store, tmp_path, signing["nightly"])
    promote(store, old, "prod", signer=ChannelSigner(store, signing["nightly"]))
    b_read = store.read_ref("tiny-llama", "prod")
    b_claim = ChannelSigner(store, signing["nightly"]).sign("tiny-llama", "prod", new.key)
    assert b_read is not None and b_claim is not None and b_claim.sequence == 2

    class BLandsAfterAsStatement:  # A's view: B's pointer write lands right after A writes its statement
        def __init__(self, inner: RegistryStore) -> None:
            self.inner, self.landed = inner, False

        def create_history(self, model: str, entry: str, body: bytes) -> bool:
            created = self.inner.create_history(model, entry, body)
            if not self.landed:
                self.landed = True
                assert self.inner.write_ref(model, "prod", new.key, expected=b_read)
            return created

        def __getattr__(self, name: str):
            return getattr(self.inner, name)

    a_view = BLandsAfterAsStatement(store)
    change = promote(a_view, old, "prod", signer=ChannelSigner(a_view, signing["nightly"]))  # type: ignore[arg-type]
    assert change.moved and change.statement == 4
    sequences = statement_sequences(store, "tiny-llama", "prod")
    assert sequences == [1, 2, 3, 4]
    claim = newest_claim(store, "tiny-llama", "prod")
    ref = store.read_ref("tiny-llama", "prod")
    assert claim is not None
    assert ref is not None and claim.key == ref.key == old.key


def test_a_corrupt_or_unwritable_trust_state_is_an_error_naming_it_never_a_check_skipped(
    signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(str(tmp_path / "registry"))
    _, new = two_builds(store, tmp_path, signing["nightly"])
    promote(store, new, "prod", signer=ChannelSigner(store, signing["nightly"]))
    state = tmp_path / "state" / "trust-state.json"
    monkeypatch.setenv("ENGINESMITH_TRUST_STATE", str(state))
    state.parent.mkdir()
    state.write_text("{not json")
    with pytest.raises(UserError, match="the trust state is corrupt") as corrupt:
        pull_channel(store, "prod", trust_file(key_dir, tmp_path), tmp_path / "dest")
    assert corrupt.value.where == str(state) and not (tmp_path / "dest").exists()
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the state's directory should be")
    monkeypatch.setenv("ENGINESMITH_TRUST_STATE", str(blocked / "trust-state.json"))
    with pytest.raises(UserError, match="cannot be written") as unwritable:
        pull_channel(store, "prod", trust_file(key_dir, tmp_path), tmp_path / "dest")
    assert unwritable.value.where == str(blocked / "trust-state.json") and not (tmp_path / "dest").exists()


def test_statements_survive_gc_and_are_no_history_record(
    store: RegistryStore, signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    old, new = two_builds(store, tmp_path, signing["nightly"])
    nightly = ChannelSigner(store, signing["nightly"])
    promote(store, old, "prod", signer=nightly)
    promote(store, new, "prod", signer=nightly)
    collect_garbage(store, keep_last=1)
    assert statement_sequences(store, "tiny-llama", "prod") == [1, 2]
    history = load_history(store, "tiny-llama")
    assert not history.unreadable
    assert Path(pull_channel(store, "prod", trust_file(key_dir, tmp_path), tmp_path / "dest").dest).is_dir()


def test_a_refused_rollback_prints_the_table_of_checks_and_writes_nothing(key_dir: Path, tmp_path: Path) -> None:
    registry = str(tmp_path / "registry")
    env = {**registry_env(registry, tmp_path / "cache"),
           "ENGINESMITH_TRUST_STATE": str(tmp_path / "state.json"), "COLUMNS": "200"}
    store = open_store(registry)
    old, new = two_builds(store, tmp_path, load_signing_key(key_file=key_dir / "nightly.key"))
    (tmp_path / "trust.yaml").write_text(f"keys: {{nightly: {key_dir}/nightly.pub}}\n"
                                         "channels: {prod: {signers: [nightly], expires: 7d}}\n")
    trust = ["--trust", str(tmp_path / "trust.yaml")]
    for manifest in (old, new):
        promoted = run_cli("promote", f"tiny-llama@{manifest.key}", "--channel", "prod", "--sign-key",
                           str(key_dir / "nightly.key"), *trust, env=env)
        assert promoted.returncode == 0, promoted.stderr
    assert "signed statement 2" in promoted.stdout
    good = run_cli("pull", "tiny-llama:prod", "--dest", str(tmp_path / "good"), *trust, env=env)
    assert good.returncode == 0, good.stderr
    shown = run_cli("show", "tiny-llama:prod", *trust, env=env)
    assert shown.returncode == 0 and "prod vouched for by" in shown.stdout and "statement 2, signed by nightly" \
        in shown.stdout, shown.stderr

    point(store, "tiny-llama", "prod", old.key)
    bad = run_cli("pull", "tiny-llama:prod", "--dest", str(tmp_path / "bad"), *trust, env=env)
    assert bad.returncode == 2 and not (tmp_path / "bad").exists()
    assert "statement 2 (tiny-llama:prod →" in bad.stderr and "FAILED: the statement names" in bad.stderr
    assert "not checked" in bad.stderr and "holds" in bad.stderr and "pulling" not in bad.stderr
    print(bad.stderr)  # the note quotes it


# --- nothing unsigned decides, and withdrawn builds ----------------------------------------------------------------


def bare_choice(store: RegistryStore, trust: Trust | None, **kwargs):
    from registry.choose import choose
    from registry.machine import describe_machine
    from registry.resolve import Constraints

    return choose(store, parse_ref("tiny-llama"), describe_machine("cpu"), Constraints(), trust, **kwargs)


def rewrite(store: RegistryStore, manifest: Manifest, **changes) -> None:
    """The attacker rewrites a manifest in place (delete and create again: what a writer of the storage can do)."""
    store.delete_manifest(manifest.model, manifest.key)
    assert store.create_manifest(manifest.model, manifest.key, manifest.model_copy(update=changes).to_bytes())


def test_a_trusted_pull_does_not_fall_back_silently_past_the_best_artefact_whose_signature_fails(
    store: RegistryStore, signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    from registry.choose import FallbackRefused

    old, new = two_builds(store, tmp_path, signing["nightly"])
    trust = trust_file(key_dir, tmp_path)
    assert bare_choice(store, trust).manifest.key == new.key
    rewrite(store, new, validation={"key": new.key, "note": "edited after signing"})
    with pytest.raises(FallbackRefused) as refused_choice:
        bare_choice(store, trust)
    message = refused_choice.value.message
    assert f"tiny-llama@{new.key[:12]}" in message and "over other content" in message and old.key[:12] in message
    allowed = bare_choice(store, trust, allow_fallback=True)
    assert allowed.manifest.key == old.key and allowed.passed_over is not None
    assert allowed.passed_over.key == new.key



def prod_withdrawn(store: RegistryStore, signing: dict[str, SigningKey], key_dir: Path,
                   tmp_path: Path) -> tuple[Manifest, Manifest, Trust]:
    """Two builds, the newer promoted to ``prod``, then withdrawn by the nightly key; and the trust file."""
    from registry.withdrawals import withdraw

    old, new = two_builds(store, tmp_path, signing["nightly"])
    promote(store, new, "prod", signer=ChannelSigner(store, signing["nightly"]))
    trust = trust_file(key_dir, tmp_path)
    withdraw(store, "tiny-llama", new.key, "wrong tokenizer", signing["nightly"])
    return old, new, trust

def test_a_withdrawn_build_is_never_chosen_and_by_key_needs_allow_withdrawn(
    store: RegistryStore, signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    from registry.choose import choose, resolve_model
    from registry.errors import WithdrawnError
    from registry.machine import describe_machine
    from registry.resolve import Constraints

    old, new, trust = prod_withdrawn(store, signing, key_dir, tmp_path)
    for trusted in (trust, None):  # without a trust list the registry's word is taken, as for everything else
        assert bare_choice(store, trusted).manifest.key == old.key
    ranked = resolve_model(store, "tiny-llama", describe_machine("cpu"), Constraints(), trust).resolution.candidates
    assert [(c.key, c.status) for c in ranked] == [(old.key, "runnable"), (new.key, "withdrawn")]
    assert "wrong tokenizer" in ranked[1].reasons[0] and "by nightly" in ranked[1].reasons[0]
    for ref in (f"tiny-llama@{new.key}", "tiny-llama:prod"):
        with pytest.raises(WithdrawnError, match="wrong tokenizer"):
            choose(store, parse_ref(ref), describe_machine("cpu"), Constraints(), trust)
    named = choose(store, parse_ref(f"tiny-llama@{new.key}"), describe_machine("cpu"), Constraints(), trust,
                   allow_withdrawn=True)
    assert named.manifest.key == new.key
    with pytest.raises(WithdrawnError):  # a channel is never the way round it
        choose(store, parse_ref("tiny-llama:prod"), describe_machine("cpu"), Constraints(), trust,
               allow_withdrawn=True)


def test_a_withdrawal_by_an_untrusted_key_is_ignored_and_said_so(
    store: RegistryStore, signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    from registry.withdrawals import withdraw

    _, new = two_builds(store, tmp_path, signing["nightly"])
    withdraw(store, "tiny-llama", new.key, "a prank", signing["laptop"])
    only_nightly = tmp_path / "only-nightly.yaml"
    only_nightly.write_text(f"keys: {{nightly: {key_dir}/nightly.pub}}\n")
    choice = bare_choice(store, load_trust([only_nightly]))
    assert choice.manifest.key == new.key
    assert any("a prank" in line and "not signed by a trusted key" in line for line in choice.ignored_withdrawals)
    revoked = trust_file(key_dir, tmp_path, "revoked: {laptop: '2020-01-01T00:00:00Z'}\n")
    assert bare_choice(store, revoked).manifest.key == new.key  # laptop is trusted, but revoked before it withdrew


def test_a_bundle_carries_the_channel_statements_and_withdrawals_and_an_air_gapped_pull_checks_them(
    signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    from registry.bundle import bundle_manifests, write_bundle
    from registry.withdrawals import withdraw

    store = open_store(str(tmp_path / "registry"))
    old, new = two_builds(store, tmp_path, signing["nightly"])
    promote(store, new, "prod", signer=ChannelSigner(store, signing["nightly"]))
    withdraw(store, "tiny-llama", old.key, "wrong tokenizer", signing["nightly"])
    manifests, refs = bundle_manifests(store, ["tiny-llama"])
    written = write_bundle(store, manifests, tmp_path / "bundle.tar", refs=refs)
    assert written.signed_records == 4  # latest (each signed publish moved it), prod, the withdrawal

    bundle = open_store(str(tmp_path / "bundle.tar"))
    trust = trust_file(key_dir, tmp_path)
    assert Path(pull_channel(bundle, "prod", trust, tmp_path / "from-bundle").dest).is_dir()
    assert bare_choice(bundle, trust).manifest.key == new.key
    from registry.choose import resolve_model
    from registry.machine import describe_machine
    from registry.resolve import Constraints

    statuses = {c.key: c.status for c in resolve_model(bundle, "tiny-llama", describe_machine("cpu"), Constraints(),
                                                         trust).resolution.candidates}
    assert statuses == {new.key: "runnable", old.key: "withdrawn"}


def test_the_nightly_renews_latest_s_statement_when_half_its_time_is_gone_and_not_before(
    tiny_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from enginesmith.core.config import load_pipeline_config
    from pipeline.common.steps import renew_latest_statements

    registry = tmp_path / "registry"
    monkeypatch.setenv("ENGINESMITH_REGISTRY", str(registry))
    pipeline = load_pipeline_config(tiny_config, check_tasks=False)
    key = load_signing_key(key_file=tiny_config.parent / "keys" / "nightly.key")
    store = open_store(str(registry))
    source = write_artefact(tmp_path / "build", files=tiny_files(seed=4))
    published = publish_artefact(store, source, signing_key=key)
    assert published.channels[0].statement == 1
    assert renew_latest_statements(pipeline, ["tiny-llama"]) == []  # fresh: nothing to do
    four_days_ago = datetime.now(timezone.utc) - timedelta(days=4)
    promote(store, load_manifest(store, "tiny-llama", published.key), "latest",
            signer=ChannelSigner(store, key, clock=lambda: four_days_ago))  # statement 2, 3 of its 7 days left
    assert renew_latest_statements(pipeline, ["tiny-llama"]) == ["tiny-llama:latest → statement 3"]
    assert statement_sequences(store, "tiny-llama", "latest") == [1, 2, 3]


def test_withdraw_and_promote_name_what_is_missing_and_a_pull_says_which_withdrawal_it_ignored(
    key_dir: Path, tmp_path: Path
) -> None:
    registry = str(tmp_path / "registry")
    env = {**registry_env(registry, tmp_path / "cache"), "COLUMNS": "200"}
    store = open_store(registry)
    _, new = two_builds(store, tmp_path, load_signing_key(key_file=key_dir / "nightly.key"))
    laptop = ["--sign-key", str(key_dir / "laptop.key")]
    refusals = [
        (run_cli("withdraw", "tiny-llama", "--reason", "bad", *laptop, env=env), "does not name one build"),
        (run_cli("withdraw", f"tiny-llama@{new.key}", "--reason", " ", *laptop, env=env), "needs its reason"),
        (run_cli("withdraw", f"tiny-llama@{new.key}", "--reason", "bad", env=env), "no signing key was given"),
        (run_cli("promote", f"tiny-llama@{new.key}", "--channel", "prod", "--expires", "7d", env=env),
         "--expires is the signed statement's"),
        (run_cli("promote", f"tiny-llama@{new.key}", "--channel", "prod", "--expires", "0", *laptop, env=env),
         "must stay good for some time"),
    ]
    for result, message in refusals:
        assert result.returncode == 2 and message in result.stderr, result.stderr
    assert statement_sequences(store, "tiny-llama", "prod") == []

    withdrawn = run_cli("withdraw", f"tiny-llama@{new.key[:12]}", "--reason", "a prank", *laptop, env=env)
    assert withdrawn.returncode == 0 and "withdrew tiny-llama@" in withdrawn.stdout, withdrawn.stderr
    (tmp_path / "only-nightly.yaml").write_text(f"keys: {{nightly: {key_dir}/nightly.pub}}\n")
    pulled = run_cli("pull", "tiny-llama", "--target", "cpu", "--trust", str(tmp_path / "only-nightly.yaml"),
                     "--dest", str(tmp_path / "dest"), env=env)
    assert pulled.returncode == 0 and f"tiny-llama@{new.key[:12]}" in pulled.stdout, pulled.stderr
    assert "ignored:" in pulled.stderr and "'a prank'" in pulled.stderr


@pytest.mark.parametrize(("extra", "where", "message"), [
    ("channels: {prod: {signers: [nightly], expire: 7d}}\n", "channels.prod", "unknown field(s) expire"),
    ("channels: {prod: {expires: soon}}\n", "channels.prod.expires", "is not a duration"),
    ("channels: {prod: {expires: 0}}\n", "channels.prod.expires", "must stay good for some time"),
    ("revoked: {nightly: yesterday}\n", "revoked.nightly", "is not a time"),
    ("revoked: {someone: '2026-01-01T00:00:00Z'}\n", "--trust", "is no trusted key's name"),
])
def test_a_trust_file_s_channel_and_revocation_fields_are_checked_with_the_field_named(
    key_dir: Path, tmp_path: Path, extra: str, where: str, message: str
) -> None:
    path = tmp_path / "trust.yaml"
    path.write_text(f"keys: {{nightly: {key_dir}/nightly.pub}}\n" + extra)
    with pytest.raises(UserError) as refused:
        load_trust([path])
    assert message in refused.value.message and where in (refused.value.where or ""), refused.value.render()


def test_the_catalogue_says_who_vouched_for_each_channel_and_which_one_is_not(
    signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    from registry.site import write_catalogue
    from registry.trust_state import trust_state

    store = open_store(str(tmp_path / "registry"))
    old, new = two_builds(store, tmp_path, signing["nightly"])
    promote(store, new, "prod", signer=ChannelSigner(store, signing["nightly"]))
    point(store, "tiny-llama", "latest", old.key)  # latest, moved by hand
    trust = trust_file(key_dir, tmp_path)
    write_catalogue(store, tmp_path / "site", registry_url=str(store.root), trust=trust)  # type: ignore[attr-defined]
    page = (tmp_path / "site" / "models" / "tiny-llama.html").read_text()
    assert "statement 1 by nightly, until" in page and "not vouched for: the statement names" in page
    with trust_state() as state:
        assert state.highest(store.identity, "tiny-llama", "prod") is None  # a page reports; it does not remember
    write_catalogue(store, tmp_path / "unchecked", registry_url=str(store.root))  # type: ignore[attr-defined]
    assert "(not checked)" in (tmp_path / "unchecked" / "models" / "tiny-llama.html").read_text()


# --- #62: statements bound to their registry, copies, unsigned moves, gc's order, withdrawals remembered -----------


def test_the_rollback_memory_holds_for_every_spelling_of_a_local_registry(
    signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "atk").mkdir()
    typed = open_store("atk/h")  # relative, as an operator types it
    old, new = two_builds(typed, tmp_path, signing["nightly"])
    nightly = ChannelSigner(typed, signing["nightly"])
    promote(typed, old, "prod", signer=nightly)
    promote(typed, new, "prod", signer=nightly)
    trust = trust_file(key_dir, tmp_path)
    pull_channel(typed, "prod", trust, tmp_path / "seen")  # the node has seen statement 2 of atk/h

    delete_record(typed, "tiny-llama", statement_entry("prod", 2))
    point(typed, "tiny-llama", "prod", old.key)
    (tmp_path / "link").symlink_to(tmp_path / "atk")
    for spelling in ("atk/h", str(tmp_path / "atk" / "h"), "./atk/../atk/h", "link/h", f"file://{tmp_path}/atk/h"):
        rolled = refused(open_store(spelling), "prod", trust, tmp_path / "rolled")
        assert rolled.check.failed == "rolled-back" and "seen 2" in rolled.check.detail, spelling


def test_a_trust_state_from_before_identities_is_folded_into_the_registry_s_identity(
    signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from registry.trust_state import trust_state

    monkeypatch.chdir(tmp_path)
    store = open_store("registry")
    old, _ = two_builds(store, tmp_path, signing["nightly"])
    promote(store, old, "prod", signer=ChannelSigner(store, signing["nightly"]))
    with trust_state() as state:  # what an older node wrote: the spelling it was given, sequence 5 seen
        state.seen["registry"] = {"tiny-llama:prod": 5}
    trust = trust_file(key_dir, tmp_path)
    for spelling in ("registry", str(tmp_path / "registry")):  # the old spelling first: then every spelling
        rolled = refused(open_store(spelling), "prod", trust, tmp_path / "d")
        assert rolled.check.failed == "rolled-back" and "seen 5" in rolled.check.detail
    with trust_state() as state:
        assert "registry" not in state.seen and state.highest(store.identity, "tiny-llama", "prod") == 5


def test_a_genuine_statement_from_another_registry_with_a_higher_sequence_is_refused(
    signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    import shutil

    prod = open_store(str(tmp_path / "prod"))
    old, new = two_builds(prod, tmp_path, signing["nightly"])
    shutil.copytree(tmp_path / "prod", tmp_path / "staging")  # the same manifests, byte for byte
    staging = open_store(str(tmp_path / "staging"))
    promote(prod, new, "canary", signer=ChannelSigner(prod, signing["nightly"]))
    for manifest in (new, old, new, old):  # staging moves canary about: its sequence 4 names the older build
        promote(staging, manifest, "canary", signer=ChannelSigner(staging, signing["nightly"]))
    entry = statement_entry("canary", 4)
    body = staging.read_history("tiny-llama", entry)
    assert body is not None and prod.create_history("tiny-llama", entry, body)  # copied in by the attacker
    point(prod, "tiny-llama", "canary", old.key)
    replayed = refused(prod, "canary", trust_file(key_dir, tmp_path), tmp_path / "replayed")
    assert replayed.check.failed == "other-registry" and replayed.check.claim is not None
    assert replayed.check.claim.sequence == 4 and f"made in {staging.identity}" in replayed.check.detail


def test_copy_carries_no_statements_and_leaves_a_channel_the_destination_vouches_for(
    key_dir: Path, tmp_path: Path
) -> None:
    import shutil

    source, destination = tmp_path / "staging", tmp_path / "prod"
    env = {**registry_env(str(source), tmp_path / "cache"), "COLUMNS": "200"}
    nightly = load_signing_key(key_file=key_dir / "nightly.key")
    old, new = two_builds(open_store(str(source)), tmp_path, nightly)
    shutil.copytree(source, destination)
    promote(open_store(str(destination)), new, "live", signer=ChannelSigner(open_store(str(destination)), nightly))
    for manifest in (new, old):
        promote(open_store(str(source)), manifest, "live", signer=ChannelSigner(open_store(str(source)), nightly))
        promote(open_store(str(source)), manifest, "canary", signer=ChannelSigner(open_store(str(source)), nightly))
    before = sorted(p.name for p in (destination / "history" / "tiny-llama").iterdir())

    copied = run_cli("copy", str(source), str(destination), "tiny-llama:live", "tiny-llama:canary", env=env)
    assert copied.returncode == 0, copied.stderr
    assert "tiny-llama:live not moved: the destination has its own signed statements" in copied.stderr
    assert f"enginesmith promote tiny-llama@{old.key} --channel live --sign-key KEY" in copied.stderr
    assert f"tiny-llama:canary: its signed statements name {source} and were not copied" in copied.stderr
    after = sorted(p.name for p in (destination / "history" / "tiny-llama").iterdir())
    assert [e for e in after if e.startswith("statement-")] == [e for e in before if e.startswith("statement-")]
    store = open_store(str(destination))
    assert store.read_ref("tiny-llama", "live").key == new.key  # type: ignore[union-attr]
    trust = trust_file(key_dir, tmp_path)
    assert Path(pull_channel(store, "live", trust, tmp_path / "live").dest).is_dir()  # still vouched for there
    assert refused(store, "canary", trust, tmp_path / "canary").check.failed == "missing"  # said so, not broken


def test_promote_without_a_signing_key_onto_a_channel_with_statements_is_refused_naming_the_flag(
    key_dir: Path, tmp_path: Path
) -> None:
    registry = str(tmp_path / "registry")
    env = {**registry_env(registry, tmp_path / "cache"), "COLUMNS": "200"}
    store = open_store(registry)
    old, new = two_builds(store, tmp_path, load_signing_key(key_file=key_dir / "nightly.key"))
    promote(store, new, "prod", signer=ChannelSigner(store, load_signing_key(key_file=key_dir / "nightly.key")))
    before = store.read_ref("tiny-llama", "prod")

    unsigned = run_cli("promote", f"tiny-llama@{old.key}", "--channel", "prod", env=env)
    assert unsigned.returncode == 2 and "Traceback" not in unsigned.stderr, unsigned.stderr
    assert unsigned.stderr.startswith("error: --sign-key: tiny-llama:prod is vouched for by signed statements")
    assert f"enginesmith promote tiny-llama@{old.key} --channel prod --sign-key KEY" in unsigned.stderr
    assert store.read_ref("tiny-llama", "prod") == before and statement_sequences(store, "tiny-llama", "prod") == [1]
    unvouched = run_cli("promote", f"tiny-llama@{old.key}", "--channel", "stable", env=env)
    assert unvouched.returncode == 0, unvouched.stderr  # a channel nobody signs moves as before


def test_publish_without_a_signing_key_publishes_but_leaves_a_vouched_latest_where_it_is_naming_promote_sign_key(
    key_dir: Path, tmp_path: Path
) -> None:
    registry = str(tmp_path / "registry")
    env = {**registry_env(registry, tmp_path / "cache"), "COLUMNS": "400"}
    store = open_store(registry)
    nightly = load_signing_key(key_file=key_dir / "nightly.key")
    vouched = publish_artefact(store, write_artefact(tmp_path / "old", files=tiny_files(seed=1)), signing_key=nightly)
    before = (store.read_ref("tiny-llama", "latest"), statement_sequences(store, "tiny-llama", "latest"))
    history = store.list_history("tiny-llama")
    source = write_artefact(tmp_path / "new", files=tiny_files(seed=2))

    unsigned = run_cli("publish", str(source), "--channel", "latest", "--channel", "canary", env=env)
    assert unsigned.returncode == 0 and "Traceback" not in unsigned.stderr, unsigned.stderr
    new = load_manifest(store, "tiny-llama", read_artefact(source).key)  # the artefact is published all the same
    held = [line for line in unsigned.stderr.splitlines() if "tiny-llama:latest" in line]
    assert held == [f"note: tiny-llama:latest not moved to {new.key[:12]}: it is vouched for by signed statements (the "
                    "newest is 1), and no signing key was given: moved unsigned, every --trust pull of it would be "
                    f"refused; to move it: enginesmith promote {new.ref} --channel latest --sign-key KEY --registry "
                    f"{registry} (or --sign-key-env NAME)"]
    assert (store.read_ref("tiny-llama", "latest"), statement_sequences(store, "tiny-llama", "latest")) == before
    assert before[0] is not None and before[0].key == vouched.key
    assert store.list_history("tiny-llama") == history  # no statement, no channel move written
    assert f"tiny-llama:canary → {new.key[:12]}" in unsigned.stdout  # a channel nobody signs moves as before
    assert pull_channel(store, "latest", trust_file(key_dir, tmp_path), tmp_path / "pulled").key == vouched.key

    assert promote(store, new, "latest", signer=ChannelSigner(store, nightly)).moved  # what the named command does
    assert statement_sequences(store, "tiny-llama", "latest") == [1, 2]


def test_the_nightly_publishes_a_validated_cell_without_a_signing_key_and_leaves_a_vouched_latest_where_it_is(
    tiny_config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from enginesmith.core.config import load_pipeline_config
    from pipeline.common import steps

    registry = tmp_path / "registry"
    monkeypatch.setenv("ENGINESMITH_REGISTRY", str(registry))
    signed = load_pipeline_config(tiny_config, check_tasks=False)
    unsigned = signed.model_copy(update={"registry": signed.registry.model_copy(update={"signing": None})})
    store = open_store(str(registry))
    first = steps.publish(read_artefact(built := write_artefact(tmp_path / "b1", files=tiny_files(seed=1))).key,
                          built, {}, signed)
    assert first.channels[0].moved and first.channels[0].statement == 1

    later = write_artefact(tmp_path / "b2", files=tiny_files(seed=2))
    result = steps.publish(read_artefact(later).key, later, {}, unsigned)  # no signing key: the cell still publishes
    assert store.read_manifest("tiny-llama", result.key) is not None
    latest = result.channels[0]
    assert not latest.moved and latest.unsigned_hold == 1 and latest.key == first.key
    assert f"enginesmith promote tiny-llama@{result.key} --channel latest --sign-key KEY" in latest.held
    assert store.read_ref("tiny-llama", "latest").key == first.key  # type: ignore[union-attr]

    next_night = write_artefact(tmp_path / "b3", files=tiny_files(seed=3))
    again = steps.publish(read_artefact(next_night).key, next_night, {}, signed)  # with its key it moves, signed
    assert again.channels[0].moved and again.channels[0].statement == 2 and not again.channels[0].held


def test_gc_orders_only_by_signed_publication_times_and_names_a_build_it_cannot_order(
    signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    registry = str(tmp_path / "registry")
    store = open_store(registry)
    built = [load_manifest(store, "tiny-llama", publish_artefact(
        store, write_artefact(tmp_path / f"b{seed}", files=tiny_files(seed=seed)), signing_key=signing[signer]).key)
        for seed, signer in ((1, "nightly"), (2, "nightly"), (3, "laptop"))]
    assert collect_garbage(store, keep_last=2, dry_run=True).deleted_manifests == [built[0].ref]

    rewrite(store, built[1], published="1999-01-01T00:00:00+00:00")  # a newer build dated before the oldest
    swept = collect_garbage(store, keep_last=2, dry_run=True)
    assert swept.deleted_manifests == [] and list(swept.unordered) == [built[1].ref]
    assert "(1999-01-01T00:00:00+00:00) is not the one its signature covers" in swept.unordered[built[1].ref]
    said = run_cli("gc", "--keep-last", "2", "--dry-run", env={**registry_env(registry, tmp_path / "cache"),
                                                               "COLUMNS": "300"})
    assert said.returncode == 0 and "would delete 0 artefact(s)" in said.stdout, said.stderr
    assert f"note: kept every build of {built[1].ref}'s cell: its publication time (1999" in said.stderr

    rewrite(store, built[1], published=built[1].published)  # genuine again
    only_nightly = tmp_path / "only-nightly.yaml"
    only_nightly.write_text(f"keys: {{nightly: {key_dir}/nightly.pub}}\n")
    trusted = collect_garbage(store, keep_last=2, dry_run=True, trust=load_trust([only_nightly]))
    assert trusted.deleted_manifests == [] and list(trusted.unordered) == [built[2].ref]
    assert "not trusted" in trusted.unordered[built[2].ref]
    both_revoked = "revoked: {nightly: '2020-01-01T00:00:00Z', laptop: '2020-01-01T00:00:00Z'}\n"
    nobody = collect_garbage(store, keep_last=2, dry_run=True, trust=trust_file(key_dir, tmp_path, both_revoked))
    assert nobody.deleted_manifests == [] and len(nobody.unordered) == 3  # under --trust nothing is guessed


def test_a_deleted_withdrawal_stays_in_force_on_a_node_that_saw_it(
    store: RegistryStore, signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    from registry.errors import WithdrawnError
    from registry.withdrawals import read_withdrawals

    old, new, trust = prod_withdrawn(store, signing, key_dir, tmp_path)
    with pytest.raises(WithdrawnError):
        pull_through(store, "prod", trust)
    (entry,) = (e for e in store.list_history("tiny-llama") if e.startswith("withdrawal-"))
    delete_record(store, "tiny-llama", entry)

    with pytest.raises(WithdrawnError, match=r"wrong tokenizer.*remembered by this node"):
        pull_through(store, "prod", trust)
    assert bare_choice(store, trust).manifest.key == old.key
    assert read_withdrawals(store, "tiny-llama", None).withdrawn == {}  # without --trust the registry is believed
    nightly_revoked = trust_file(key_dir, tmp_path, f"revoked: {{nightly: '{new.published}'}}\n")
    assert new.key not in read_withdrawals(store, "tiny-llama", nightly_revoked).withdrawn  # re-checked each time


def test_a_key_trusted_only_for_canary_cannot_withdraw_what_prod_serves(
    store: RegistryStore, signing: dict[str, SigningKey], key_dir: Path, tmp_path: Path
) -> None:
    from registry.errors import WithdrawnError
    from registry.withdrawals import withdraw

    _, new = two_builds(store, tmp_path, signing["nightly"])
    for channel in ("prod", "canary"):
        promote(store, new, channel, signer=ChannelSigner(store, signing["nightly"]))
    trust = trust_file(key_dir, tmp_path)  # prod: [nightly]; canary names no signers, so laptop may sign it
    withdraw(store, "tiny-llama", new.key, "a prank", signing["laptop"])
    choice = pull_through(store, "prod", trust)
    assert choice.manifest.key == new.key
    assert any("'a prank'" in line and "channel 'prod' allows nightly" in line for line in choice.ignored_withdrawals)
    with pytest.raises(WithdrawnError, match="a prank"):
        pull_through(store, "canary", trust)


def pull_through(store: RegistryStore, channel: str, trust: Trust):  # type: ignore[no-untyped-def]
    """What a ``--trust`` pull of ``tiny-llama:CHANNEL`` chooses (``registry.choose``, as the CLI asks it)."""
    from registry.choose import choose
    from registry.machine import describe_machine
    from registry.resolve import Constraints

    return choose(store, parse_ref(f"tiny-llama:{channel}"), describe_machine("cpu"), Constraints(), trust)
