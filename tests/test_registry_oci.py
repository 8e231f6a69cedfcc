"""The registry in an OCI registry (#35): every verb against a real CNCF distribution server on loopback
(Debian's docker-registry, htpasswd auth), ORAS's own client both ways, a blob read cut mid-way and resumed, and the
bad inputs: a registry URL without a namespace or with an empty port, wrong credentials, an artifact not ours."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from enginesmith.core.errors import UserError
from registry.cache import BlobCache
from registry.catalog import find_manifest
from registry.names import Ref
from registry.oci import OciStore, parse_oci_url
from registry.publish import publish_artefact
from registry.pull import RESUME_ATTEMPTS, pull_artefact
from registry.stages import fetch_quantized, read_stashed, stash_quantized
from tests.conftest import run_cli, write_key_pair
from tests.cutting_proxy import CuttingProxy
from tests.oci_registry import PASSWORD, USERNAME, OciRegistry, running_oci_registry, write_credential_helper
from tests.registry_helpers import (
    MIB,
    QUANTIZE_KEY,
    cli_json,
    deterministic_bytes,
    exports,
    file_digests,
    read_artefact,
    registry_env,
    tiny_files,
    write_artefact,
    write_quantized,
)


def namespace() -> str:
    return f"team/test-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(("url", "problem"), [
    ("oci://registry.example.com", "names no namespace"),
    ("oci://registry.example.com:/team", "empty or non-numeric port"),
    ("oci://:5000/team", "names no registry host"),
    ("oci://registry.example.com/Team", "not a valid OCI repository name"),
])
def test_a_registry_url_without_namespace_or_with_a_bad_port_names_what_is_wrong(url: str, problem: str) -> None:
    with pytest.raises(UserError, match=problem) as refused:
        parse_oci_url(url)
    assert refused.value.where == "--registry" and "oci://host[:port]/namespace" in (refused.value.hint or "")


def test_every_verb_round_trips_through_a_real_oci_registry(oci_registry: OciRegistry, tmp_path: Path) -> None:
    url = oci_registry.registry_url(namespace())
    env = registry_env(url, tmp_path / "cache", oci_registry.env)
    private = write_key_pair(tmp_path / "keys", "nightly")
    first = write_artefact(tmp_path / "a", created="2026-01-01T00:00:00+00:00")
    second = write_artefact(tmp_path / "b", files=tiny_files(seed=9), created="2026-02-01T00:00:00+00:00")

    published = cli_json("publish", str(first), "--sign-key", str(private), env=env)
    assert published["created"] and published["uploaded_blobs"] == 3 and published["signer"]
    again = cli_json("publish", str(second), "--sign-key", str(private), env=env)
    assert again["reused_blobs"] == 0 and again["channels"][0]["moved"]
    listing = cli_json("ls", "tiny-llama", env=env)
    assert {m["key"] for m in listing["manifests"]} == {published["key"], again["key"]} and not listing["unreadable"]
    assert listing["channels"] == {"latest": again["key"]}
    resolution = cli_json("resolve", "tiny-llama", "--target", "cpu", "--trust", str(private.with_suffix(".pub")),
                          env=env)
    assert resolution["chosen"]["key"] == again["key"] and resolution["chosen"]["signer"] == "nightly"

    dest = tmp_path / "served"
    pulled = cli_json("pull", f"tiny-llama@{published['key']}", "--target", "cpu", "--dest", str(dest), "--trust",
                      str(private.with_suffix(".pub")), env=env)
    artefact = read_artefact(first)
    assert pulled["signature"]["signer"] == "nightly"
    assert file_digests(dest, [f.path for f in artefact.files]) == {f.path: f.sha256 for f in artefact.files}

    moved = cli_json("promote", f"tiny-llama@{published['key']}", "--channel", "stable", env=env)
    assert moved["moved"] and cli_json("ls", "tiny-llama", env=env)["channels"]["stable"] == published["key"]
    history = cli_json("history", "tiny-llama", env=env)
    assert any(m["channel"] == "stable" for m in history["channel_moves"]) and not history["unreadable"]
    site = tmp_path / "site"
    assert run_cli("catalogue", "--out", str(site), env=env).returncode == 0
    assert published["key"][:12] in (site / "models" / "tiny-llama.html").read_text()
    bundle = tmp_path / "air-gap.tar"
    assert run_cli("bundle", "tiny-llama:stable", "--out", str(bundle), env=env).returncode == 0
    from_bundle = cli_json("pull", "tiny-llama", "--from-bundle", str(bundle), "--target", "cpu", "--dest",
                           str(tmp_path / "from-bundle"), env=env)
    assert from_bundle["key"] == published["key"]

    # gc deletes a manifest through the API (blobs are the server's own garbage collection): of three builds of the
    # cell it keeps the newest and the one `stable` points at (all signed: gc orders a cell by signed times, #62)
    third = cli_json("publish", str(write_artefact(tmp_path / "c", files=tiny_files(seed=10),
                                                   created="2026-03-01T00:00:00+00:00")),
                     "--sign-key", str(private), env=env)
    collected = cli_json("gc", "--keep-last", "1", "--grace", "0", env=env)
    assert collected["deleted_blobs"] == 0 and not collected["unordered"]
    kept = {m["key"] for m in cli_json("ls", "tiny-llama", env=env)["manifests"]}
    assert kept == {published["key"], third["key"]}


def test_stage_and_history_records_are_artifacts_of_their_own(oci_registry: OciRegistry,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in oci_registry.env.items():
        monkeypatch.setenv(name, value)
    store = OciStore(oci_registry.registry_url(namespace()))
    assert store.create_stage("quantize", "k" * 64, b'{"files": []}') is True
    assert store.create_stage("quantize", "k" * 64, b'{"files": ["other"]}') is False  # created once
    assert store.read_stage("quantize", "k" * 64) == b'{"files": []}'
    assert store.list_stage_keys("quantize") == ["k" * 64]
    store.delete_stage("quantize", "k" * 64)
    assert store.read_stage("quantize", "k" * 64) is None
    assert store.create_history("tiny-llama", "entry-2", b"{}") and store.create_history("tiny-llama", "entry-1", b"[]")
    assert store.list_history("tiny-llama") == ["entry-1", "entry-2"]
    assert store.read_history("tiny-llama", "entry-1") == b"[]"
    assert store.list_models() == []  # records are not artefacts


def test_oras_pulls_what_we_publish_into_identical_files_and_what_it_pushes_is_refused_with_the_reason(
    oci_registry: OciRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import oras.client

    space = namespace()
    env = registry_env(oci_registry.registry_url(space), tmp_path / "cache", oci_registry.env)
    source = write_artefact(tmp_path / "build")
    key = cli_json("publish", str(source), env=env)["key"]
    client = oras.client.OrasClient(hostname=oci_registry.host, insecure=True, auth_backend="basic")
    client.login(username=USERNAME, password=PASSWORD, hostname=oci_registry.host)

    client.pull(target=f"{oci_registry.host}/{space}/models/tiny-llama:{key}", outdir=str(tmp_path / "oras"))
    artefact = read_artefact(source)
    assert file_digests(tmp_path / "oras", [f.path for f in artefact.files]) == {f.path: f.sha256
                                                                                for f in artefact.files}

    foreign = tmp_path / "notes.txt"
    foreign.write_text("pushed by ORAS, not by enginesmith\n")
    monkeypatch.chdir(tmp_path)  # ORAS pushes files named relative to the working directory
    client.push(target=f"{oci_registry.host}/{space}/models/tiny-llama:oras-pushed", files=[foreign.name])
    shown = run_cli("show", "tiny-llama@oras-pushed", env=env)
    assert shown.returncode == 2 and "not one enginesmith wrote" in shown.stderr
    listing = cli_json("ls", "tiny-llama", env=env)
    # #52: another tool's record is "not ours", not an unreadable artefact: ls does not count it, gc skips it.
    assert [u["key"] for u in listing["foreign"]] == ["oras-pushed"] and not listing["unreadable"]
    assert len(listing["manifests"]) == 1
    [summary] = cli_json("ls", env=env)
    assert (summary["artefacts"], summary["foreign"]) == (1, 1)
    swept = cli_json("gc", "--grace", "0", env=env)
    assert swept["skipped_foreign"] == ["tiny-llama:oras-pushed"] and swept["kept_manifests"] == 1
    assert "not one enginesmith wrote" in run_cli("show", "tiny-llama@oras-pushed", env=env).stderr  # left alone
    assert cli_json("show", f"tiny-llama@{key}", env=env)["key"] == key


def test_wrong_credentials_are_a_clear_error_that_does_not_show_the_password(
    oci_registry: OciRegistry, tmp_path: Path
) -> None:
    wrong = "not-the-oci-password-4711"
    env = registry_env(oci_registry.registry_url(namespace()), tmp_path / "cache",
                       {**oci_registry.env, "ENGINESMITH_OCI_PASSWORD": wrong})
    result = run_cli("publish", str(write_artefact(tmp_path / "build")), env=env)
    assert result.returncode == 2 and "refused the credentials" in result.stderr
    assert "ENGINESMITH_OCI_USERNAME" in result.stderr and wrong not in result.stdout + result.stderr


def test_a_blob_read_cut_mid_way_is_resumed_from_its_offset_on_the_oci_registry(
    oci_registry: OciRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in oci_registry.env.items():
        monkeypatch.setenv(name, value)
    files = {"weights.safetensors": deterministic_bytes(3 * MIB, 11), **tiny_files()}
    source = write_artefact(tmp_path / "build", files=files)
    weights = next(f for f in read_artefact(source).files if f.path == "weights.safetensors")
    space = namespace()
    publish_artefact(OciStore(oci_registry.registry_url(space)), source)
    cuts, cut_after = RESUME_ATTEMPTS + 1, weights.size // 8 + 12_345
    proxy = CuttingProxy(f"http://{oci_registry.host}", cut_digest=str(weights.sha256), cut_after_bytes=cut_after,
                         cuts=cuts)

    with proxy.running():
        through_proxy = OciStore(f"oci+http://{proxy.endpoint.removeprefix('http://')}/{space}")
        manifest = find_manifest(through_proxy, Ref("tiny-llama", channel="latest"))
        result = pull_artefact(through_proxy, manifest, dest=tmp_path / "dest", cache=BlobCache(tmp_path / "cache"))

    assert proxy.cuts_left == 0
    assert proxy.ranges[str(weights.sha256)] == [""] + [f"bytes={cut_after * i}-" for i in range(1, cuts + 1)]
    assert proxy.body_bytes[str(weights.sha256)] == weights.size  # each byte crossed the network once
    assert result.refetched == [] and hashlib.sha256((tmp_path / "dest" / "weights.safetensors").read_bytes()
                                                     ).hexdigest() == weights.sha256
    assert json.loads((tmp_path / "dest" / ".enginesmith-pull.json").read_text())["key"] == manifest.key


def test_the_bearer_token_flow_fetches_a_new_token_once_when_the_registry_refuses_an_expired_one(
    oci_token_registry: OciRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = oci_token_registry.token_server
    assert tokens is not None
    for name, value in oci_token_registry.env.items():
        monkeypatch.setenv(name, value)
    url = oci_token_registry.registry_url(namespace())
    store = OciStore(url)
    source = write_artefact(tmp_path / "build")
    publish_artefact(store, source)  # every request answered a Bearer challenge with a token for its scope
    assert tokens.issued > 0

    # Tokens that expired while the store held them (issued an hour ago): the registry refuses each once, the store
    # fetches a new one and goes on.
    tokens.expired = True
    stale = {scope: tokens.token(USERNAME, [scope]) for scope in store._auth._tokens}  # the store's token cache
    tokens.expired = False
    store._auth._tokens.update(stale)
    issued_before = tokens.issued
    refused_before = oci_token_registry.log_path.read_text().count("invalid token")
    manifest = find_manifest(store, Ref("tiny-llama", channel="latest"))
    result = pull_artefact(store, manifest, dest=tmp_path / "dest", cache=BlobCache(tmp_path / "cache"))
    assert tokens.issued > issued_before and result.downloaded_bytes > 0
    assert oci_token_registry.log_path.read_text().count("invalid token") > refused_before  # the registry refused
    artefact = read_artefact(source)
    assert file_digests(tmp_path / "dest", [f.path for f in artefact.files]) == {f.path: f.sha256
                                                                                for f in artefact.files}

    # A token service that only hands out expired tokens: one new token per request, then a clear error.
    tokens.expired = True
    try:
        with pytest.raises(UserError, match="refused the credentials") as refused:
            OciStore(url).list_models()
    finally:
        tokens.expired = False
    assert PASSWORD not in refused.value.render()


def test_a_publish_killed_half_way_continues_its_upload_session(
    oci_registry: OciRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from registry.oci import CHUNK_BYTES
    from tests.registry_helpers import start_cli
    from tests.waiting import kill_when

    weights_bytes = 4 * CHUNK_BYTES
    source = write_artefact(tmp_path / "build", files={"weights.safetensors": deterministic_bytes(weights_bytes, 5),
                                                       **tiny_files()})
    weights = next(f for f in read_artefact(source).files if f.path == "weights.safetensors")
    url = oci_registry.registry_url(namespace())
    env = registry_env(url, tmp_path / "cache", oci_registry.env)
    log = tmp_path / "publish.log"
    publisher = start_cli("publish", str(source), "--limit-rate", "16M", "--jobs", "1", env=env, log=log)

    def recorded_offset() -> int:
        sessions = list((tmp_path / "cache" / "oci-uploads").glob(f"*/{weights.sha256}"))
        try:
            return int(json.loads(sessions[0].read_text())["offset"]) if sessions else 0
        except (ValueError, KeyError, FileNotFoundError):
            return 0

    kill_when(publisher, lambda: CHUNK_BYTES <= recorded_offset() < weights_bytes,
              "the weights' upload session holding at least one chunk, not all", timeout_s=120, log=log)
    held = recorded_offset()

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    store = OciStore(url)
    assert store.read_manifest("tiny-llama", weights.sha256) is None and store.list_manifest_keys("tiny-llama") == []
    resumed = publish_artefact(store, source)
    assert resumed.created and resumed.resumed_bytes == held
    assert resumed.uploaded_bytes <= weights_bytes - held + sum(f.size for f in read_artefact(source).files
                                                                  if f.path != weights.path)
    assert not list((tmp_path / "cache" / "oci-uploads").glob(f"*/{weights.sha256}"))  # the session ended
    pulled = pull_artefact(store, find_manifest(store, Ref("tiny-llama", channel="latest")), dest=tmp_path / "dest",
                           cache=BlobCache(tmp_path / "pull-cache"))
    assert hashlib.sha256((Path(pulled.dest) / weights.path).read_bytes()).hexdigest() == weights.sha256


class _StoppedBetweenChunks(Exception):
    pass


class _StopAfterFirstChunk:
    """Progress that stops a blob's upload once its first chunk is in the session and recorded: a publish killed
    between two chunks, as the next run finds it."""

    def started(self, name: str, total_bytes: int, done_bytes: int) -> None:
        pass

    def advanced(self, name: str, bytes_count: int) -> None:
        raise _StoppedBetweenChunks(name)

    def finished(self, name: str) -> None:
        pass


def test_an_upload_session_the_next_publish_starts_again_from_0_is_cancelled_on_the_server(
    oci_registry: OciRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#62: killed publishes left their upload sessions' bytes on the server (1.45 GiB after 21). A run that cannot
    continue the session it finds (here the server's upload status answers 503) starts the blob again from 0 and
    cancels the old session with a DELETE on its URL."""
    for name, value in {**oci_registry.env, "ENGINESMITH_CACHE_DIR": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("registry.oci.CHUNK_BYTES", MIB)
    source = tmp_path / "weights.safetensors"
    source.write_bytes(deterministic_bytes(3 * MIB + 17, 7))
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    space = namespace()
    proxy = CuttingProxy(f"http://{oci_registry.host}")

    with proxy.running():
        store = OciStore(f"oci+http://{proxy.endpoint.removeprefix('http://')}/{space}")
        with pytest.raises(_StoppedBetweenChunks):
            store.put_blob(digest, source, progress=_StopAfterFirstChunk())
        ((abandoned, held),) = oci_registry.upload_sessions(space).items()
        assert held == MIB
        (kept,) = (tmp_path / "cache" / "oci-uploads").glob(f"*/{digest}")
        old_location = json.loads(kept.read_text())["location"]

        proxy.upload_status_left_to_fail = 1
        assert store.put_blob(digest, source) == 0  # started again from 0
        assert store.blob_size(digest) == source.stat().st_size
        status = httpx.get(old_location, auth=(USERNAME, PASSWORD))

    assert oci_registry.upload_sessions(space).get(abandoned, 0) == 0  # its bytes are gone from the server
    assert status.status_code == 404 and "BLOB_UPLOAD_UNKNOWN" in status.text


def test_a_blob_whose_bytes_do_not_match_leaves_no_upload_session_on_the_server(
    oci_registry: OciRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#62: a file that changed while it was published failed its sha256 after the whole of it was in the session,
    and the session stayed on the server; it is cancelled before the error is raised."""
    from registry.errors import IntegrityError

    for name, value in {**oci_registry.env, "ENGINESMITH_CACHE_DIR": str(tmp_path / "cache")}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("registry.oci.CHUNK_BYTES", MIB)
    source = tmp_path / "weights.safetensors"
    source.write_bytes(deterministic_bytes(2 * MIB + 5, 8))
    expected = hashlib.sha256(b"the bytes the publisher hashed before the file changed").hexdigest()
    space = namespace()

    with pytest.raises(IntegrityError, match="content has sha256"):
        OciStore(oci_registry.registry_url(space)).put_blob(expected, source)

    assert oci_registry.upload_sessions(space) and set(oci_registry.upload_sessions(space).values()) == {0}


@pytest.mark.parametrize("damage", ["path outside", "blob of another size"])
def test_an_oci_manifest_pointing_outside_the_destination_or_at_a_wrong_blob_writes_nothing(
    damage: str, oci_registry: OciRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in oci_registry.env.items():
        monkeypatch.setenv(name, value)
    url = oci_registry.registry_url(namespace())
    store = OciStore(url)
    source = write_artefact(tmp_path / "build")
    key = publish_artefact(store, source).key
    document = json.loads(store.read_manifest("tiny-llama", key) or b"")
    entry = next(f for f in document["artefact"]["files"] if f["path"] == "model.safetensors")
    if damage == "path outside":
        entry["path"] = "../../outside.safetensors"
    else:
        entry["size"] += 1000  # the layer's blob holds fewer bytes than the manifest says
    # replaced by someone with push rights, past publish's checks
    store.delete_manifest("tiny-llama", key)
    assert store.create_manifest("tiny-llama", key, json.dumps(document).encode())

    dest = tmp_path / "deploy" / "served"
    result = run_cli("pull", f"tiny-llama@{key}", "--target", "cpu", "--dest", str(dest),
                     env=registry_env(url, tmp_path / "cache", oci_registry.env))
    assert result.returncode != 0
    assert ("could write outside the destination" in result.stderr if damage == "path outside"
            else "model.safetensors" in result.stderr and "sha256" in result.stderr), result.stderr
    assert not dest.exists() and not (tmp_path / "outside.safetensors").exists()
    assert not (tmp_path / "deploy").exists() or not list((tmp_path / "deploy").iterdir())


def test_a_tag_moved_between_resolving_and_pulling_does_not_change_what_is_pulled(
    oci_registry: OciRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in oci_registry.env.items():
        monkeypatch.setenv(name, value)
    store = OciStore(oci_registry.registry_url(namespace()))
    source = write_artefact(tmp_path / "build")
    key = publish_artefact(store, source).key
    chosen = find_manifest(store, Ref("tiny-llama", key=key))
    # someone else replaces what the key's tag points at (a manifest of other files), after it was read
    other = write_artefact(tmp_path / "other", files=tiny_files(seed=21))
    publish_artefact(store, other)
    document = json.loads(store.read_manifest("tiny-llama", read_artefact(other).key) or b"")
    document["artefact"]["key"] = document["key"] = key
    store.delete_manifest("tiny-llama", key)
    assert store.create_manifest("tiny-llama", key, json.dumps(document).encode())

    result = pull_artefact(store, chosen, dest=tmp_path / "dest", cache=BlobCache(tmp_path / "cache"))
    artefact = read_artefact(source)  # the blobs are fetched by the digests of the manifest that was read
    assert file_digests(tmp_path / "dest", [f.path for f in artefact.files]) == {f.path: f.sha256
                                                                                for f in artefact.files}
    record = json.loads((tmp_path / "dest" / ".enginesmith-pull.json").read_text())
    assert record["manifest"]["artefact"]["files"] == json.loads(chosen.model_dump_json())["artefact"]["files"]
    assert result.key == key


def test_an_https_registry_is_trusted_through_ssl_cert_file_and_refused_with_what_to_do_without_it(
    oci_registry: OciRegistry, tmp_path: Path
) -> None:
    with running_oci_registry(tmp_path / "https-registry", tls=True) as https_registry:
        assert https_registry.tls is not None
        url = https_registry.registry_url(namespace())
        assert url.startswith("oci://")
        untrusting = registry_env(url, tmp_path / "cache", {**https_registry.env, "SSL_CERT_FILE": "",
                                                             "SSL_CERT_DIR": ""})
        build = write_artefact(tmp_path / "build")

        refused = run_cli("publish", str(build), env=untrusting)
        assert refused.returncode == 2, refused.stderr
        assert "certificate is not trusted here" in refused.stderr and "SSL_CERT_FILE" in refused.stderr

        trusting = {**untrusting, "SSL_CERT_FILE": str(https_registry.tls.ca_file)}
        published = cli_json("publish", str(build), env=trusting)
        dest = tmp_path / "pulled"
        cli_json("pull", f"tiny-llama@{published['key']}", "--target", "cpu", "--dest", str(dest), env=trusting)
        artefact = read_artefact(build)
        assert file_digests(dest, [f.path for f in artefact.files]) == {f.path: f.sha256 for f in artefact.files}

        # oci+http:// (plain HTTP) against it: named as such, with the URL to use instead.
        plain = run_cli("ls", env={**trusting, "ENGINESMITH_REGISTRY": url.replace("oci://", "oci+http://")})
        assert plain.returncode == 2, plain.stderr
        assert "speaks HTTPS" in plain.stderr and f"use {url}" in plain.stderr

    # oci:// (HTTPS) against a plain-HTTP registry: named as such, with the URL to use instead.
    plain_url = oci_registry.registry_url(namespace()).replace("oci+http://", "oci://")
    wrong_scheme = run_cli("ls", env=registry_env(plain_url, tmp_path / "cache", oci_registry.env))
    assert wrong_scheme.returncode == 2, wrong_scheme.stderr
    assert "did not answer TLS" in wrong_scheme.stderr and f"oci+http://{oci_registry.host}/" in wrong_scheme.stderr


def test_credentials_from_a_docker_credential_helper_publish_and_pull(oci_registry: OciRegistry,
                                                                       tmp_path: Path) -> None:
    bin_dir, docker_dir = tmp_path / "bin", tmp_path / "docker"
    docker_dir.mkdir()
    (docker_dir / "config.json").write_text(json.dumps({"auths": {oci_registry.host: {}}, "credsStore": "test"}))
    write_credential_helper(bin_dir, "test", {oci_registry.host: (USERNAME, PASSWORD)})
    env = registry_env(oci_registry.registry_url(namespace()), tmp_path / "cache",
                       {"ENGINESMITH_OCI_USERNAME": "", "ENGINESMITH_OCI_PASSWORD": "",
                        "DOCKER_CONFIG": str(docker_dir), "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    build = write_artefact(tmp_path / "build")

    published = cli_json("publish", str(build), env=env)
    dest = tmp_path / "pulled"
    cli_json("pull", f"tiny-llama@{published['key']}", "--target", "cpu", "--dest", str(dest), env=env)
    artefact = read_artefact(build)
    assert file_digests(dest, [f.path for f in artefact.files]) == {f.path: f.sha256 for f in artefact.files}
    assert set((bin_dir / "test.asked").read_text().split()) == {oci_registry.host}

    # The helper holds nothing for this host: anonymous, which this registry refuses, saying what to set.
    write_credential_helper(bin_dir, "test", {})
    refused = run_cli("ls", env=env)
    assert refused.returncode == 2 and "refused the credentials" in refused.stderr


def test_a_registry_that_cannot_mount_gets_each_blob_copied_a_chunk_at_a_time(
    oci_registry: OciRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in oci_registry.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("registry.oci.CHUNK_BYTES", MIB)  # so that a 3-MiB file takes several chunks
    files = {"weights.safetensors": deterministic_bytes(3 * MIB + 17, 5), **tiny_files()}
    source = write_artefact(tmp_path / "build", files=files)
    artefact = read_artefact(source)
    space = namespace()
    proxy = CuttingProxy(f"http://{oci_registry.host}", refuse_mounts=True)

    with proxy.running():
        publish_artefact(OciStore(f"oci+http://{proxy.endpoint.removeprefix('http://')}/{space}"), source)

    assert proxy.mounts_refused == len({f.sha256 for f in artefact.files})  # a blob two files share: mounted once
    copied = [size for path, size in proxy.patches if f"/{space}/models/" in path]
    assert sum(copied) == sum({f.sha256: f.size for f in artefact.files}.values()) and max(copied) <= MIB
    store = OciStore(oci_registry.registry_url(space))
    manifest = find_manifest(store, Ref("tiny-llama", channel="latest"))
    pull_artefact(store, manifest, dest=tmp_path / "dest", cache=BlobCache(tmp_path / "cache"))
    assert file_digests(tmp_path / "dest", [f.path for f in artefact.files]) == {f.path: f.sha256
                                                                                 for f in artefact.files}


def test_the_registrys_own_garbage_collection_keeps_the_blobs_of_artefacts_and_stage_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with running_oci_registry(tmp_path / "server") as server:  # a server of its own: this test stops it
        for name, value in server.env.items():
            monkeypatch.setenv(name, value)
        store = OciStore(server.registry_url(namespace()))
        made = write_quantized(tmp_path / "quantize-node", exports(seed=4))
        assert stash_quantized(store, made).created
        source = write_artefact(tmp_path / "build", files=tiny_files(seed=6))
        publish_artefact(store, source)
        orphan = tmp_path / "orphan"
        orphan.write_bytes(deterministic_bytes(4096, 3))
        orphan_digest = hashlib.sha256(orphan.read_bytes()).hexdigest()
        store.put_blob(orphan_digest, orphan)  # named by nothing: the sweep's to delete

        swept = server.garbage_collect()

        assert "blob eligible for deletion" in swept and orphan_digest in swept  # it did sweep, and not ours
        record = read_stashed(store, QUANTIZE_KEY)
        assert record is not None
        out_dir = tmp_path / "build-node" / "quantized"
        fetch_quantized(store, record, out_dir, BlobCache(tmp_path / "build-node" / "cache"))
        assert file_digests(out_dir, [f.path for f in made.files]) == {f.path: f.sha256 for f in made.files}
        manifest = find_manifest(store, Ref("tiny-llama", channel="latest"))
        pull_artefact(store, manifest, dest=tmp_path / "dest", cache=BlobCache(tmp_path / "cache"))
        artefact = read_artefact(source)
        assert file_digests(tmp_path / "dest", [f.path for f in artefact.files]) == {f.path: f.sha256
                                                                                     for f in artefact.files}


def test_two_publishes_sharing_a_cache_upload_a_blob_they_both_hold_once(
    oci_registry: OciRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in oci_registry.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ENGINESMITH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("registry.oci.CHUNK_BYTES", MIB)
    shared = tmp_path / "tokenizer.bin"
    shared.write_bytes(deterministic_bytes(3 * MIB + 5, 8))
    digest = hashlib.sha256(shared.read_bytes()).hexdigest()
    space = namespace()
    proxy = CuttingProxy(f"http://{oci_registry.host}")

    with proxy.running(), ThreadPoolExecutor(2) as pool:
        url = f"oci+http://{proxy.endpoint.removeprefix('http://')}/{space}"
        both = [pool.submit(OciStore(url).put_blob, digest, shared) for _ in range(2)]
        results = [future.result(timeout=120) for future in both]

    assert len(proxy.patches) == 4  # 3 MiB and 5 bytes in 1-MiB chunks, sent once
    assert sorted(results) == [0, shared.stat().st_size]  # the second found it uploaded: nothing to send
    assert OciStore(oci_registry.registry_url(space)).blob_size(digest) == shared.stat().st_size


def test_a_channel_too_long_for_an_oci_tag_names_the_channel_and_its_limit() -> None:
    store = OciStore("oci://registry.example.com/team")
    with pytest.raises(UserError, match=r"on an OCI registry a channel is the tag 'channel\.'") as refused:
        store.read_ref("tiny-llama", "c" * 125)
    assert refused.value.where == "--channel" and "at most 120 characters" in (refused.value.hint or "")


def test_a_registry_url_with_credentials_is_refused_without_repeating_them() -> None:
    with pytest.raises(UserError, match="holds credentials") as refused:
        parse_oci_url("oci://alice:s3cret-pw-4711@registry.example.com:5000/team")
    assert "s3cret-pw-4711" not in f"{refused.value.message} {refused.value.hint}"
    assert "ENGINESMITH_OCI_USERNAME" in (refused.value.hint or "")


def test_upload_urls_resolve_against_the_answering_url_and_carry_credentials_only_to_the_registry(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGINESMITH_OCI_USERNAME", USERNAME)
    monkeypatch.setenv("ENGINESMITH_OCI_PASSWORD", PASSWORD)
    store = OciStore("oci://registry.example.com:5000/team")
    uploads = "https://registry.example.com:5000/v2/team/blobs/blobs/uploads/"
    opened = httpx.Request("POST", uploads)

    def located(location: str) -> str:
        return store._upload_location(httpx.Response(202, headers={"Location": location}, request=opened),
                                      "team/blobs")

    assert located("3f1c?_state=abc") == f"{uploads}3f1c?_state=abc"  # relative to the uploads URL, as RFC 3986 says
    assert located("/v2/team/blobs/blobs/uploads/3f1c") == f"{uploads}3f1c"
    assert located("https://storage.example.net/up/1") == "https://storage.example.net/up/1"

    challenge = httpx.Response(401, headers={"WWW-Authenticate": 'Basic realm="registry"'}, request=opened)
    assert store._auth.answer(challenge, "repository:team/blobs:push,pull", httpx.Client())
    scope = "repository:team/blobs:push,pull"
    assert store._auth_header(f"{uploads}3f1c", scope)["Authorization"].startswith("Basic ")
    for elsewhere in ("https://storage.example.net/up/1", "http://registry.example.com:5000/v2/team/blobs/x",
                      "https://registry.example.com/v2/team/blobs/x"):
        assert store._auth_header(elsewhere, scope) == {}, elsewhere  # another host, scheme or port: no credentials


def test_a_registry_without_the_catalog_api_is_an_error_for_a_listing_not_an_empty_registry(tmp_path: Path) -> None:
    class NoCatalog(BaseHTTPRequestHandler):  # TEST DOUBLE: a registry that answers 404 to /v2/_catalog, as ECR does
        def do_GET(self) -> None:
            self.send_response(404 if self.path.startswith("/v2/_catalog") else 200)
            self.send_header("Content-Type", "application/json")
            body = b'{"errors": [{"code": "NOT_FOUND"}]}' if self.path.startswith("/v2/_catalog") else b"{}"
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), NoCatalog)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        store = OciStore(f"oci+http://127.0.0.1:{server.server_address[1]}/team")
        with pytest.raises(UserError, match="does not offer the _catalog API") as refused:
            store.list_models()
        assert "enginesmith ls MODEL" in (refused.value.hint or "")
    finally:
        server.shutdown()
        server.server_close()


def test_a_web_server_that_is_not_a_registry_is_an_error_not_an_empty_registry(tmp_path: Path) -> None:
    """#52: an HTTP server that is not a registry read as an empty one (rc 0): its /v2/ answers neither 200 with the
    API's answer nor 401."""
    from functools import partial
    from http.server import SimpleHTTPRequestHandler

    (tmp_path / "index.html").write_text("<html>a web site</html>")
    handler = partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"oci+http://127.0.0.1:{server.server_address[1]}/team"
    try:
        with pytest.raises(UserError, match="is not an OCI registry: GET /v2/ answered 404") as refused:
            OciStore(url).list_manifest_keys("tiny-llama")
        assert refused.value.where == url
        listed = run_cli("ls", "tiny-llama", "--registry", url)
        assert listed.returncode != 0 and "not an OCI registry" in listed.stderr
    finally:
        server.shutdown()
        server.server_close()


def test_a_registry_whose_head_answers_carry_no_digest_still_creates_once_and_deletes(
    oci_registry: OciRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in oci_registry.env.items():
        monkeypatch.setenv(name, value)
    source = write_artefact(tmp_path / "build")
    proxy = CuttingProxy(f"http://{oci_registry.host}", head_without_digest=True)
    with proxy.running():
        store = OciStore(f"oci+http://{proxy.endpoint.removeprefix('http://')}/{namespace()}")
        first = publish_artefact(store, source)
        again = publish_artefact(store, source)
        assert first.created and not again.created
        assert store.create_stage("quantized", "k" * 64, b"{}") and not store.create_stage("quantized", "k" * 64, b"[]")
        store.delete_manifest("tiny-llama", first.key)
        assert store.read_manifest("tiny-llama", first.key) is None
