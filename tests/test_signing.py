"""Signed artefacts (#34): publish signs with OpenSSF model-signing, pull and resolve verify against a trust list,
promote honours a channel's allow-list; model-signing's own CLI verifies what we pull and signs what we publish.

Every bad input runs on a local registry (fast) and on S3 (SeaweedFS on loopback, slow tier): each is refused with
its reason, nothing is written to the destination and nothing is half-published.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from registry.cache import BlobCache
from registry.catalog import find_manifest, load_manifest
from registry.errors import IntegrityError, SignatureError
from registry.gc import collect_garbage
from registry.manifest import PUBLICATION_FILE, PULL_RECORD_FILE, SIGNATURE_FILE, Manifest
from registry.names import Ref
from registry.publish import publish_artefact
from registry.pull import ChosenProfile, pull_artefact, read_pull_record
from registry.refs import promote
from registry.signing import authorize_channel, load_signing_key, load_trust, sign_manifest
from registry.store import RegistryStore, open_store
from tests.conftest import run_cli, write_key_pair
from tests.registry_helpers import file_digests, read_artefact, registry_env, tiny_files, write_artefact

pytest.importorskip("model_signing", reason="needs model-signing (part of the base install)")

MODEL_SIGNING_CLI = [sys.executable, "-m", "model_signing"]
PASSPHRASE = "correct horse battery staple 4711"


# --- keys and stores ---------------------------------------------------------------------------------------------


def make_key(directory: Path, name: str, passphrase: str | None = None) -> tuple[Path, Path]:
    """(private key file, public key file): ``tests.conftest.write_key_pair``."""
    private = write_key_pair(directory, name, passphrase)
    return private, private.with_suffix(".pub")


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A registry per test: a local directory, or a prefix of its own on the session's SeaweedFS server."""
    if request.param == "local":
        yield str(tmp_path / "registry")
        return
    server = request.getfixturevalue("seaweedfs")
    request.getfixturevalue("s3_env")  # the server's credentials and endpoint, for boto3 in this process
    yield server.registry_url(f"signing-{os.urandom(5).hex()}")


@pytest.fixture
def store(registry_url: str) -> RegistryStore:
    return open_store(registry_url)


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    return {name: make_key(tmp_path / "keys", name) for name in ("nightly", "laptop")}


def publish_signed(store: RegistryStore, source: Path, key_file: Path, **kwargs) -> Manifest:
    result = publish_artefact(store, source, signing_key=load_signing_key(key_file=key_file), **kwargs)
    return load_manifest(store, result.model, result.key)


def pull(store: RegistryStore, manifest: Manifest, dest: Path, cache: Path, trust_paths: list[Path]):
    return pull_artefact(store, manifest, dest=dest, cache=BlobCache(cache), trust=load_trust(trust_paths))



def sign_with_model_signing_cli(directory: Path, private: Path) -> Path:
    """Sign ``directory`` with model-signing's own CLI, as a team would before publishing; returns the bundle
    (``model.sig`` inside it)."""
    bundle = directory / "model.sig"
    signed = subprocess.run([*MODEL_SIGNING_CLI, "sign", "key", str(directory), "--private_key", str(private),
                             "--signature", str(bundle)], capture_output=True, text=True, timeout=120)
    assert signed.returncode == 0, signed.stdout + signed.stderr
    return bundle

# --- the round trip, and model-signing's own tools ---------------------------------------------------------------


def test_a_signed_pull_says_who_signed_and_model_signing_verifies_the_pulled_directory(
    store: RegistryStore, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    private, public = keys["nightly"]
    source = write_artefact(tmp_path / "build")
    manifest = publish_signed(store, source, private, validation={"key": "v" * 64, "artefact_key":
                                                                  read_artefact(source).key, "note": "measured"})
    assert manifest.schema_version == 3 and manifest.signature is not None
    assert manifest.signature.covers == "publication-dated"

    dest = tmp_path / "served"
    result = pull(store, manifest, dest, tmp_path / "cache", [public])

    assert result.signature is not None and result.signature.signer == "nightly"
    record = read_pull_record(dest)
    assert record is not None and record.signature == result.signature
    assert json.loads((dest / PUBLICATION_FILE).read_text())["validation"]["note"] == "measured"
    # model-signing's verifier, as a separate process, on the directory a deployment got
    upstream = subprocess.run([*MODEL_SIGNING_CLI, "verify", "key", str(dest), "--signature",
                               str(dest / SIGNATURE_FILE), "--public_key", str(public)],
                              capture_output=True, text=True, timeout=120)
    assert upstream.returncode == 0, upstream.stdout + upstream.stderr
    # and its Python API, in a process of its own
    api = subprocess.run([sys.executable, "-c", (
        "import sys, model_signing\n"
        "model_signing.verifying.Config().use_elliptic_key_verifier(public_key=sys.argv[1]).verify(sys.argv[2], "
        "sys.argv[3])\nprint('verified')"), str(public), str(dest), str(dest / SIGNATURE_FILE)],
        capture_output=True, text=True, timeout=120)
    assert api.returncode == 0 and "verified" in api.stdout, api.stderr
    # and it notices a file changed after the pull (our pull record is outside the signature; the report is not)
    (dest / PUBLICATION_FILE).write_text((dest / PUBLICATION_FILE).read_text().replace("measured", "forged"))
    (dest / PULL_RECORD_FILE).write_text("{}")
    tampered = subprocess.run([*MODEL_SIGNING_CLI, "verify", "key", str(dest), "--signature",
                               str(dest / SIGNATURE_FILE), "--public_key", str(public)],
                              capture_output=True, text=True, timeout=120)
    assert tampered.returncode != 0 and PUBLICATION_FILE in tampered.stdout + tampered.stderr


def test_a_directory_signed_by_model_signing_is_published_with_its_signature_and_verified_on_pull(
    keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    private, public = keys["laptop"]
    source = write_artefact(tmp_path / "build")
    bundle = sign_with_model_signing_cli(source, private)
    env = registry_env(str(tmp_path / "registry"), tmp_path / "cache")

    published = run_cli("publish", str(source), "--signature", str(bundle), "--json", env=env)
    assert published.returncode == 0, published.stderr
    assert json.loads(published.stdout)["signature_covers"] == "artefact"
    dest = tmp_path / "served"
    pulled = run_cli("pull", "tiny-llama", "--target", "cpu", "--dest", str(dest), "--trust", str(public), "--json",
                     env=env)
    assert pulled.returncode == 0, pulled.stderr
    assert json.loads(pulled.stdout)["signature"]["signer"] == "laptop"
    assert (dest / SIGNATURE_FILE).read_bytes() == bundle.read_bytes()
    upstream = subprocess.run([*MODEL_SIGNING_CLI, "verify", "key", str(dest), "--signature",
                               str(dest / SIGNATURE_FILE), "--public_key", str(public), "--ignore_unsigned_files"],
                              capture_output=True, text=True, timeout=120)
    assert upstream.returncode == 0, upstream.stdout + upstream.stderr

    # a bundle over another directory is refused at publish, before anything is uploaded
    other = write_artefact(tmp_path / "other", files=tiny_files(seed=3))
    refused = run_cli("publish", str(other), "--signature", str(bundle), env=registry_env(
        str(tmp_path / "registry-2"), tmp_path / "cache"))
    assert refused.returncode == 2 and "is not over this artefact directory" in refused.stderr
    assert not (tmp_path / "registry-2" / "blobs").exists() or not any((tmp_path / "registry-2" / "blobs").rglob("*"))


def test_the_documented_signing_commands_run_as_written(tmp_path: Path) -> None:
    from tests import documentation

    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    [block] = documentation.marked_blocks("signing")
    source = write_artefact(tmp_path / "build")
    env = {**os.environ, "ARTEFACT_DIR": str(source), "ENGINESMITH_REGISTRY": str(tmp_path / "registry"),
           "ENGINESMITH_CACHE_DIR": str(tmp_path / "cache"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "signed by nightly" in result.stdout and "tiny-llama:prod" in result.stdout
    assert "signed statement 1" in result.stdout and (tmp_path / "prod" / "config.json").is_file()
    assert "wrong tokenizer" in result.stderr and "refused: withdrawn" in result.stdout
    assert not (tmp_path / "again").exists()


# --- bad input: each refused with its reason, nothing written ---------------------------------------------------


def refused_pull(store: RegistryStore, manifest: Manifest, tmp_path: Path, trust: list[Path],
                 error: type[Exception] = SignatureError) -> str:
    dest = tmp_path / "refused"
    cache = tmp_path / "refused-cache"
    with pytest.raises(error) as refused:
        pull(store, manifest, dest, cache, trust)
    assert not dest.exists()
    assert not [p for p in dest.parent.iterdir() if p.name.startswith(".refused")]  # no staging left either
    return str(refused.value)


def test_an_unsigned_artefact_is_refused_where_trust_is_required(
    store: RegistryStore, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    source = write_artefact(tmp_path / "build")
    result = publish_artefact(store, source)
    manifest = load_manifest(store, result.model, result.key)
    message = refused_pull(store, manifest, tmp_path, [keys["nightly"][1]])
    assert "is not signed, and a trust list is set" in message
    assert not (tmp_path / "refused-cache").exists() or not any((tmp_path / "refused-cache").rglob("*.partial"))


def test_a_trusted_pull_of_a_model_none_signed_says_so_not_that_nothing_runs_here(
    keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """#62: `pull MODEL --trust` where nothing is signed ended "no artefact of tiny-llama runs on cpu (no NVIDIA GPU
    detected)" under a table that said "not signed"."""
    registry = tmp_path / "registry"
    publish_artefact(open_store(str(registry)), write_artefact(tmp_path / "build"))
    env = {"ENGINESMITH_REGISTRY": str(registry), "ENGINESMITH_CACHE_DIR": str(tmp_path / "cache"), "COLUMNS": "200"}
    unsigned = run_cli("pull", "tiny-llama", "--target", "cpu", "--trust", str(keys["nightly"][1]), "--dest",
                       str(tmp_path / "dest"), env=env)
    assert unsigned.returncode == 1, unsigned.stdout + unsigned.stderr
    assert unsigned.stderr.strip().splitlines()[-1] == (
        "error: no artefact of tiny-llama is signed (1 published), and --trust takes only signed ones; nothing was "
        "fetched or written")
    publish_signed(open_store(str(registry)), write_artefact(tmp_path / "other", files=tiny_files(seed=3)),
                   keys["nightly"][0])
    untrusted = run_cli("pull", "tiny-llama", "--target", "cpu", "--trust", str(keys["laptop"][1]), "--dest",
                        str(tmp_path / "dest"), env=env)
    assert untrusted.returncode == 1, untrusted.stdout + untrusted.stderr
    assert "error: --trust refuses every artefact of tiny-llama: 1 not signed, 1 signed by a key it does not list" \
        in untrusted.stderr
    resolved = run_cli("resolve", "tiny-llama", "--target", "cpu", "--trust", str(keys["laptop"][1]), env=env)
    assert resolved.returncode == 1 and resolved.stdout.strip().splitlines()[-1].startswith(
        "--trust refuses every artefact of tiny-llama: 1 not signed, 1 signed by a key"), resolved.stdout
    assert not (tmp_path / "dest").exists() and not (tmp_path / "cache").exists()


def test_a_blob_changed_after_signing_fails_its_sha256(
    store: RegistryStore, registry_url: str, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    source = write_artefact(tmp_path / "build")
    manifest = publish_signed(store, source, keys["nightly"][0])
    weights = next(f for f in manifest.artefact.files if f.path == "model.safetensors")
    changed = tmp_path / "changed"
    changed.write_bytes(b"\x00" * weights.size)
    _overwrite_blob(store, registry_url, str(weights.sha256), changed)
    message = refused_pull(store, manifest, tmp_path, [keys["nightly"][1]], error=IntegrityError)
    assert "model.safetensors" in message and "do not match sha256" in message



def test_a_cached_blob_changed_through_a_pulled_file_is_fetched_again_under_trust(
    store: RegistryStore, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    manifest = publish_signed(store, write_artefact(tmp_path / "build"), keys["nightly"][0])
    first = pull(store, manifest, tmp_path / "first", tmp_path / "cache", [keys["nightly"][1]])
    assert first.linked_files  # the pulled files are hard links to the cached blobs
    weights = tmp_path / "first" / "model.safetensors"
    weights.chmod(0o644)
    with weights.open("r+b") as edited:  # the same size, other bytes: what a size check cannot see
        edited.write(b"\xff" * 64)

    again = pull(store, manifest, tmp_path / "second", tmp_path / "cache", [keys["nightly"][1]])

    assert again.refetched == ["model.safetensors"]
    expected = {f.path: f.sha256 for f in manifest.artefact.files}
    assert file_digests(tmp_path / "second", list(expected)) == expected

def test_a_manifest_edited_and_re_signed_by_an_untrusted_key_is_refused(
    store: RegistryStore, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    source = write_artefact(tmp_path / "build")
    genuine = publish_signed(store, source, keys["nightly"][0])
    # an attacker with write access to the bucket: new validation numbers, signed with a key of their own
    forged = genuine.model_copy(update={"validation": {"throughput": 1e9}, "signature": None})
    body = sign_manifest(forged, load_signing_key(key_file=keys["laptop"][0]))
    forged = forged.with_signature(_stored_signature(store, body, forged))
    message = refused_pull(store, forged, tmp_path, [keys["nightly"][1]])
    assert "which is not trusted (trusted: nightly)" in message


def test_another_artefacts_valid_signature_swapped_in_is_refused(
    store: RegistryStore, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    first = publish_signed(store, write_artefact(tmp_path / "a"), keys["nightly"][0])
    second = publish_signed(store, write_artefact(tmp_path / "b", files=tiny_files(seed=7)), keys["nightly"][0])
    assert second.signature is not None
    swapped = first.with_signature(second.signature)
    message = refused_pull(store, swapped, tmp_path, [keys["nightly"][1]])
    assert "is over other content" in message and "differs" in message


@pytest.mark.parametrize("damage", ["truncated", "garbled"])
def test_a_truncated_or_garbled_bundle_is_refused(
    damage: str, store: RegistryStore, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    manifest = publish_signed(store, write_artefact(tmp_path / "build"), keys["nightly"][0])
    body = sign_manifest(manifest.model_copy(update={"signature": None}), load_signing_key(key_file=keys["nightly"][0]))
    damaged = body[: len(body) // 2] if damage == "truncated" else body.replace(b'"payload":"', b'"payload":"AAAA')
    assert damaged != body
    broken = manifest.with_signature(_stored_signature(store, damaged, manifest))
    message = refused_pull(store, broken, tmp_path, [keys["nightly"][1]])
    assert ("the signature bundle is damaged" in message if damage == "truncated"
            else "does not verify with key nightly" in message or "damaged" in message)


def test_a_signer_not_on_the_channels_allow_list_cannot_promote(
    store: RegistryStore, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    trust_file = tmp_path / "keys" / "trust.yaml"
    trust_file.write_text("keys: {nightly: nightly.pub, laptop: laptop.pub}\nchannels: {prod: [nightly]}\n")
    trust = load_trust([trust_file])
    from_laptop = publish_signed(store, write_artefact(tmp_path / "a"), keys["laptop"][0], channels=[])
    from_nightly = publish_signed(store, write_artefact(tmp_path / "b", files=tiny_files(seed=5)),
                                  keys["nightly"][0], channels=[])

    with pytest.raises(SignatureError, match="is signed by laptop, and only nightly may put artefacts on channel "
                                             "'prod'"):
        authorize_channel(store, from_laptop, "prod", trust)
    assert store.read_ref(from_laptop.model, "prod") is None
    assert authorize_channel(store, from_laptop, "canary", trust).signer == "laptop"  # no list: any trusted key
    assert authorize_channel(store, from_nightly, "prod", trust).signer == "nightly"
    promote(store, from_nightly, "prod")
    assert find_manifest(store, Ref(model=from_nightly.model, channel="prod")).key == from_nightly.key

    # Someone with write access moves prod to the laptop's build without --trust: a pull through prod refuses it,
    # before writing anything; the same build named by its key is still the laptop's, which the trust list accepts.
    promote(store, from_laptop, "prod")
    through_prod = find_manifest(store, Ref(model=from_laptop.model, channel="prod"))
    dest = tmp_path / "prod"
    with pytest.raises(SignatureError, match="only nightly may put artefacts on channel 'prod'"):
        pull_artefact(store, through_prod, dest=dest, cache=BlobCache(tmp_path / "cache"), trust=trust, channel="prod")
    assert not dest.exists()
    by_key = pull_artefact(store, through_prod, dest=dest, cache=BlobCache(tmp_path / "cache"), trust=trust)
    assert by_key.signature is not None and by_key.signature.signer == "laptop"


def test_with_a_signature_over_the_files_only_no_serving_profile_or_other_model_name_is_taken(
    store: RegistryStore, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    private, public = keys["laptop"]
    source = write_artefact(tmp_path / "build")
    bundle = sign_with_model_signing_cli(source, private)
    result = publish_artefact(store, source, signature=bundle)
    manifest = load_manifest(store, result.model, result.key)
    trust = load_trust([public])
    # A report no trusted key signed would choose the flags `enginesmith serve` starts the server with.
    profile = ChosenProfile(name="max_num_seqs=4", runtime="vllm", args=["--max-num-seqs", "4"],
                            slo="ttft_p95<=500ms", concurrency=4, goodput=1.0)
    with pytest.raises(SignatureError, match="validation report, which its signature does not cover"):
        pull_artefact(store, manifest, dest=tmp_path / "slo", cache=BlobCache(tmp_path / "cache"), trust=trust,
                      profile=profile)
    # The same signed files stored as another model's (the name is not in a signature over the files only).
    renamed = manifest.model_copy(update={"model": "other-model"})
    assert "stored as model 'other-model'" in refused_pull(store, renamed, tmp_path, [public])
    pulled = pull_artefact(store, manifest, dest=tmp_path / "ok", cache=BlobCache(tmp_path / "cache"), trust=trust)
    assert pulled.signature is not None and pulled.signature.covers == "artefact"
    assert not (tmp_path / "slo").exists()


def test_a_refused_pull_draws_no_progress_bar_and_names_the_artefact_once(keys, tmp_path: Path) -> None:
    """#52: a refused pull first drew a 'pulling 0.0/96.1 KiB' bar, and its error named the reference twice."""
    registry = tmp_path / "registry"
    env = registry_env(str(registry), tmp_path / "cache")
    published = run_cli("publish", str(write_artefact(tmp_path / "build")), "--sign-key", str(keys["laptop"][0]),
                        "--json", env=env)
    key = json.loads(published.stdout)["key"]
    refused = run_cli("pull", "tiny-llama:latest", "--dest", str(tmp_path / "dest"), "--trust",
                      str(keys["nightly"][1]), env=env)
    assert refused.returncode == 2 and "which is not trusted (trusted: nightly)" in refused.stderr
    assert refused.stderr.count(f"tiny-llama@{key}") == 1, refused.stderr
    assert "pulling" not in refused.stderr and "KiB" not in refused.stderr
    assert not (tmp_path / "dest").exists()


def test_an_empty_trust_setting_is_an_error_not_verification_switched_off(tmp_path: Path) -> None:
    env = registry_env(str(tmp_path / "registry"), tmp_path / "cache")
    for args, extra, named in [(["--trust", ""], {}, "--trust is empty"),
                               ([], {"ENGINESMITH_TRUST": ""}, "ENGINESMITH_TRUST is set but empty")]:
        refused = run_cli("pull", "tiny-llama", "--target", "cpu", "--dest", str(tmp_path / "dest"), *args,
                          env={**env, **extra})
        assert refused.returncode == 2 and named in refused.stderr, refused.stderr
        assert not (tmp_path / "dest").exists()


def test_a_wrong_passphrase_is_refused_and_nothing_is_published(tmp_path: Path) -> None:
    private, _ = make_key(tmp_path / "keys", "nightly", passphrase=PASSPHRASE)
    source = write_artefact(tmp_path / "build")
    registry = tmp_path / "registry"
    env = registry_env(str(registry), tmp_path / "cache", {"SIGNING_PASSPHRASE": "wrong " + PASSPHRASE})

    result = run_cli("publish", str(source), "--sign-key", str(private), "--passphrase-env", "SIGNING_PASSPHRASE",
                     env=env)
    assert result.returncode == 2
    assert "cannot be decrypted with that passphrase" in result.stderr and str(private) in result.stderr
    assert PASSPHRASE not in result.stderr + result.stdout
    assert not registry.exists() or not any(registry.rglob("*.json"))


def test_a_cut_or_damaged_key_file_says_so_and_does_not_blame_the_passphrase(tmp_path: Path) -> None:
    """#52: a truncated key with --passphrase-env was reported as a wrong passphrase."""
    private, _ = make_key(tmp_path / "keys", "nightly", passphrase=PASSPHRASE)
    whole = private.read_text()
    lines = whole.splitlines(keepends=True)
    cases = {"cut short (no -----END line)": "".join(lines[: len(lines) // 2]),
             "cut short or damaged": "".join(lines[:2] + lines[3:]),  # a body line lost, the END line kept
             "damaged (its body is not base64)": whole.replace(lines[1], "!" * (len(lines[1]) - 1) + "\n")}
    source = write_artefact(tmp_path / "build")
    env = registry_env(str(tmp_path / "registry"), tmp_path / "cache", {"SIGNING_PASSPHRASE": PASSPHRASE})
    for says, text in cases.items():
        private.write_text(text)
        result = run_cli("publish", str(source), "--sign-key", str(private), "--passphrase-env",
                         "SIGNING_PASSPHRASE", env=env)
        assert result.returncode == 2 and says in result.stderr, (says, result.stderr)
        assert "passphrase" not in result.stderr.split("hint")[0] and PASSPHRASE not in result.stderr
    private.write_text(whole)
    assert run_cli("publish", str(source), "--sign-key", str(private), "--passphrase-env", "SIGNING_PASSPHRASE",
                   env=env).returncode == 0  # the whole file with its passphrase signs


def test_a_private_key_others_can_read_is_refused(tmp_path: Path) -> None:
    private, _ = make_key(tmp_path / "keys", "nightly")
    private.chmod(0o644)
    with pytest.raises(Exception, match=r"readable by other users \(mode 0644\)"):
        load_signing_key(key_file=private)


def test_no_key_material_or_passphrase_reaches_output_manifest_or_pulled_files(tmp_path: Path) -> None:
    private, public = make_key(tmp_path / "keys", "nightly", passphrase=PASSPHRASE)
    key_text = private.read_text()
    registry = tmp_path / "registry"
    env = registry_env(str(registry), tmp_path / "cache", {"NIGHTLY_KEY": key_text, "NIGHTLY_PASSPHRASE": PASSPHRASE})
    source = write_artefact(tmp_path / "build")

    published = run_cli("publish", str(source), "--sign-key-env", "NIGHTLY_KEY", "--passphrase-env",
                        "NIGHTLY_PASSPHRASE", env=env)
    shown = run_cli("show", "tiny-llama:latest", "--json", env=env)
    dest = tmp_path / "served"
    pulled = run_cli("pull", "tiny-llama", "--target", "cpu", "--dest", str(dest), "--trust", str(public), env=env)
    assert published.returncode == shown.returncode == pulled.returncode == 0, published.stderr + pulled.stderr
    assert "signed by key" in published.stdout and "signed by nightly" in pulled.stdout
    key_body = "".join(line for line in key_text.splitlines() if "-----" not in line)
    secrets = [PASSPHRASE, key_body[:40], key_body[-40:]]
    written = [published.stdout, published.stderr, shown.stdout, pulled.stdout, pulled.stderr]
    written += [p.read_text(errors="replace") for p in [*registry.rglob("*"), *dest.rglob("*")] if p.is_file()]
    assert not [s for s in secrets for text in written if s in text]


def test_without_model_signing_trust_is_a_clear_error(tmp_path: Path) -> None:
    _, public = make_key(tmp_path / "keys", "nightly")
    code = ("import sys; sys.modules['model_signing'] = None\n"  # as if an install had lost it
            "from pathlib import Path\nfrom enginesmith.core.errors import UserError\n"
            "from registry.signing import load_trust\n"
            f"try:\n    load_trust([Path({str(public)!r})])\nexcept UserError as error:\n    print(error.render())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "need model-signing, which is not installed" in result.stdout
    assert "reinstall enginesmith" in result.stdout


def test_a_loaded_key_and_its_passphrase_are_scrubbed_from_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    private, _ = make_key(tmp_path / "keys", "nightly", passphrase=PASSPHRASE)
    key_line = private.read_text().splitlines()[3]
    monkeypatch.setenv("NIGHTLY_KEY", private.read_text())
    monkeypatch.setenv("NIGHTLY_PASSPHRASE", PASSPHRASE)
    load_signing_key(key_env="NIGHTLY_KEY", passphrase_env="NIGHTLY_PASSPHRASE")
    with caplog.at_level(logging.INFO):
        logging.getLogger("some.library").info("signing with %s and %s", key_line, PASSPHRASE)
    assert key_line not in caplog.text and PASSPHRASE not in caplog.text and "***" in caplog.text


# --- backends, gc, resolution -----------------------------------------------------------------------------------


def test_resolve_with_trust_passes_over_what_is_unsigned_or_untrusted(
    store: RegistryStore, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    from registry.choose import resolve_model
    from registry.machine import describe_machine
    from registry.resolve import Constraints

    unsigned = publish_artefact(store, write_artefact(tmp_path / "a", created="2026-03-01T00:00:00+00:00"))
    by_laptop = publish_signed(store, write_artefact(tmp_path / "b", files=tiny_files(seed=2),
                                                     created="2026-02-01T00:00:00+00:00"), keys["laptop"][0])
    by_nightly = publish_signed(store, write_artefact(tmp_path / "c", files=tiny_files(seed=3),
                                                      created="2026-01-01T00:00:00+00:00"), keys["nightly"][0])
    result = resolve_model(store, "tiny-llama", describe_machine("cpu"), Constraints(),
                           load_trust([keys["nightly"][1]]))
    statuses = {c.key: (c.status, c.signer) for c in result.resolution.candidates}
    assert statuses[by_nightly.key] == ("runnable", "nightly")
    assert statuses[unsigned.key][0] == statuses[by_laptop.key][0] == "untrusted"
    assert result.resolution.chosen is not None and result.resolution.chosen.key == by_nightly.key


def test_gc_keeps_the_signatures_of_live_manifests_and_a_bundle_carries_them(
    store: RegistryStore, keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    from registry.bundle import write_bundle

    manifest = publish_signed(store, write_artefact(tmp_path / "build"), keys["nightly"][0])
    assert manifest.signature is not None
    collect_garbage(store, grace_s=0)
    assert store.blob_size(manifest.signature.sha256) == manifest.signature.size

    bundle_file = tmp_path / "air-gap.tar"
    write_bundle(store, [manifest], bundle_file)
    from_bundle = open_store(str(bundle_file))
    dest = tmp_path / "from-bundle"
    result = pull(from_bundle, load_manifest(from_bundle, manifest.model, manifest.key), dest, tmp_path / "cache-2",
                  [keys["nightly"][1]])
    assert result.signature is not None and result.signature.signer == "nightly"
    paths = [f.path for f in manifest.artefact.files]
    assert file_digests(dest, paths) == {f.path: f.sha256 for f in manifest.artefact.files}


def test_show_says_a_signer_is_unchecked_until_trust_checks_it_and_refuses_one_that_does_not_hold(
    keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """The manifest's signer field is anyone's word who can write the registry; ``show --trust`` checks it."""
    store = open_store(str(tmp_path / "registry"))
    by_nightly = publish_signed(store, write_artefact(tmp_path / "a"), keys["nightly"][0])
    by_laptop = publish_signed(store, write_artefact(tmp_path / "b", files=tiny_files(seed=3)), keys["laptop"][0])
    env = registry_env(str(tmp_path / "registry"), tmp_path / "cache")

    def show(manifest: Manifest, *trust: str) -> subprocess.CompletedProcess[str]:
        return run_cli("show", f"tiny-llama@{manifest.key}", *trust, env={**env, "COLUMNS": "300"})

    unchecked = show(by_laptop)
    assert unchecked.returncode == 0 and "(over the publication and its time; not checked)" in unchecked.stdout
    checked = show(by_nightly, "--trust", str(keys["nightly"][1]))
    assert checked.returncode == 0, checked.stderr
    assert "nightly (key" in checked.stdout and "checked against --trust" in checked.stdout
    refused = show(by_laptop, "--trust", str(keys["nightly"][1]))
    assert refused.returncode == 2 and "which is not trusted (trusted: nightly)" in refused.stderr, refused.stderr
    assert "checked against" not in refused.stdout


def test_the_catalogue_and_history_name_each_artefacts_signing_key(
    keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    from registry.history import outcome_from_manifest
    from registry.local import LocalStore
    from registry.site import write_catalogue

    store = LocalStore(tmp_path / "registry")
    signed = publish_signed(store, write_artefact(tmp_path / "a", recipe="fp8"), keys["nightly"][0])
    unsigned = load_manifest(store, "tiny-llama", publish_artefact(
        store, write_artefact(tmp_path / "b", recipe="int4-awq", files=tiny_files(seed=4))).key)
    fingerprint = load_signing_key(key_file=keys["nightly"][0]).fingerprint
    assert outcome_from_manifest(signed).signer == fingerprint and outcome_from_manifest(unsigned).signer is None

    out = tmp_path / "site"
    write_catalogue(store, out, registry_url=str(store.root))
    model_page = (out / "models" / "tiny-llama.html").read_text()
    assert f"key {fingerprint[:16]} (over the publication and its time; not checked)" in model_page
    assert "unsigned" in model_page
    assert f"key {fingerprint[:16]}" in (out / "models" / "tiny-llama" / f"{signed.key}.html").read_text()


def test_the_catalogue_with_trust_says_which_signatures_hold(
    keys: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    store = open_store(str(tmp_path / "registry"))
    by_nightly = publish_signed(store, write_artefact(tmp_path / "a", recipe="fp8"), keys["nightly"][0])
    by_laptop = publish_signed(store, write_artefact(tmp_path / "b", recipe="int4-awq", files=tiny_files(seed=5)),
                               keys["laptop"][0])
    out = tmp_path / "site"
    written = run_cli("catalogue", "--out", str(out), "--trust", str(keys["nightly"][1]),
                      env=registry_env(str(tmp_path / "registry"), tmp_path / "cache"))
    assert written.returncode == 0, written.stderr
    model_page = (out / "models" / "tiny-llama.html").read_text()
    nightly = load_signing_key(key_file=keys["nightly"][0]).fingerprint
    assert f"nightly (key {nightly[:16]}; checked)" in model_page and "not checked" not in model_page
    assert "does not hold:" in model_page and "which is not trusted (trusted: nightly)" in model_page
    assert "does not hold:" in (out / "models" / "tiny-llama" / f"{by_laptop.key}.html").read_text()
    assert "checked)" in (out / "models" / "tiny-llama" / f"{by_nightly.key}.html").read_text()


# --- helpers ------------------------------------------------------------------------------------------------------


def _stored_signature(store: RegistryStore, body: bytes, manifest: Manifest):
    """Store ``body`` as a blob (as an attacker with write access would) and return a reference to it."""
    import hashlib

    from registry.manifest import SignatureRef

    digest = hashlib.sha256(body).hexdigest()
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"enginesmith-test-sig-{digest[:12]}"
    path.write_bytes(body)
    try:
        store.put_blob(digest, path)
    finally:
        path.unlink()
    return SignatureRef(sha256=digest, size=len(body), signer="", covers="publication")


def _overwrite_blob(store: RegistryStore, registry_url: str, digest: str, replacement: Path) -> None:
    """Change a stored blob's bytes behind the registry's back (the bucket written by someone else)."""
    if registry_url.startswith("s3://"):
        import boto3

        bucket, _, prefix = registry_url.removeprefix("s3://").partition("/")
        boto3.client("s3").upload_file(str(replacement), bucket, f"{prefix}/blobs/sha256/{digest}")
        return
    blob = Path(registry_url) / "blobs" / "sha256" / digest
    blob.chmod(0o644)
    shutil.copyfile(replacement, blob)
