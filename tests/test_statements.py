"""Signed channel statements (#52 items 1–2, the checks without a store): an in-toto statement in DSSE, checked
against the trust list, the pointer, the time and what this node has seen; and the node's trust state file."""

from __future__ import annotations

import base64
import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from enginesmith.core.errors import UserError
from registry.signing import load_signing_key, load_trust
from registry.statements import check_statement, manifest_digest, new_claim, sign_statement
from registry.trust_state import trust_state
from tests.conftest import write_key_pair

NOW = datetime(2026, 12, 5, 12, 0, tzinfo=timezone.utc)
MANIFEST = b'{"model": "tiny-llama", "key": "k2"}'
PROD_REGISTRY = "s3://engines/prod at https://s3.amazonaws.com"


@pytest.fixture(scope="module")
def signing(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    keys = tmp_path_factory.mktemp("keys")
    release, laptop = write_key_pair(keys, "release"), write_key_pair(keys, "laptop")
    (keys / "trust.yaml").write_text(f"keys: {{release: {keys / 'release.pub'}, nightly: {keys / 'laptop.pub'}}}\n"
                                     "channels: {prod: [release]}\n")
    trust = load_trust([keys / "trust.yaml"])
    only_release = load_trust([keys / "release.pub"])
    return load_signing_key(key_file=release), load_signing_key(key_file=laptop), trust, only_release


def _statement(key, *, model="tiny-llama", channel="prod", sequence_before=2, body=MANIFEST,  # type: ignore[no-untyped-def]
               valid_for=timedelta(days=7), issued=NOW, registry=PROD_REGISTRY) -> bytes:
    claim = new_claim(registry=registry, model=model, channel=channel, key="k2", manifest_body=body,
                      previous=sequence_before, now=issued, valid_for=valid_for)
    return sign_statement(claim, key)


def _check(body: bytes, trust, *, channel="prod", pointer="k2", highest=None, now=NOW):  # type: ignore[no-untyped-def]
    return check_statement(body, trust, registry=PROD_REGISTRY, model="tiny-llama", channel=channel,
                           pointer_key=pointer, pointer_digest=manifest_digest(MANIFEST), highest_seen=highest, now=now)


def test_a_genuine_statement_holds_and_is_a_dsse_envelope_of_an_in_toto_statement(signing) -> None:
    release, _, trust, _ = signing
    body = _statement(release)
    checked = _check(body, trust, highest=3)
    assert checked.holds and checked.signer == "release" and checked.claim is not None
    assert checked.claim.sequence == 3 and checked.claim.expires == NOW + timedelta(days=7)
    envelope = json.loads(body)
    assert envelope["payloadType"] == "application/vnd.in-toto+json" and len(envelope["signatures"]) == 1
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["subject"] == [{"name": "tiny-llama@k2", "digest": {"sha256": manifest_digest(MANIFEST)}}]


def test_each_attack_is_refused_naming_the_check_that_failed(signing) -> None:
    release, laptop, trust, only_release = signing
    genuine = _statement(release)
    cases = {
        "rolled-back": _check(genuine, trust, highest=4),  # this node saw sequence 4: the channel was moved back
        "expired": _check(genuine, trust, now=NOW + timedelta(days=7)),  # a frozen channel serves a stale pointer
        "other-model-or-channel": _check(_statement(release, model="other-model"), trust),  # replayed from another
        "other-registry": _check(_statement(release, registry="s3://engines/staging at https://s3.amazonaws.com",
                                            sequence_before=40), trust),  # staging's, copied in with a higher sequence
        "not-the-pointer": _check(genuine, trust, pointer="k1"),  # the pointer moved by hand, the statement did not
        "signer-not-allowed": _check(_statement(laptop), trust),  # a trusted key, but prod allows release only
        "untrusted-signer": _check(_statement(laptop), only_release),
    }
    for failure, checked in cases.items():
        assert checked.failed == failure, (failure, checked)
        assert not checked.holds and checked.detail
    assert "has seen 4" in cases["rolled-back"].detail
    assert _check(_statement(release, channel="staging"), trust).failed == "other-model-or-channel"
    assert _check(genuine, trust, channel="staging").failed == "other-model-or-channel"
    changed = check_statement(genuine, trust, registry=PROD_REGISTRY, model="tiny-llama", channel="prod",
                              pointer_key="k2", pointer_digest=manifest_digest(MANIFEST + b" "), highest_seen=None,
                              now=NOW)
    assert changed.failed == "not-the-pointer" and "manifest changed" in changed.detail


def test_a_statement_that_names_no_registry_is_refused_as_possibly_another_registry_s(signing) -> None:
    # Made before statements named their registry: nothing tells a staging statement from a production one, and the
    # history keeps every old one, so a writer could replay them for ever; a promote with --sign-key replaces it.
    release, _, trust, _ = signing
    unbound = _check(_statement(release, registry=None), trust)  # type: ignore[arg-type]
    assert unbound.failed == "other-registry" and "names no registry" in unbound.detail
    assert unbound.claim is not None and unbound.claim.registry is None


def test_a_payload_changed_under_its_signature_or_not_a_statement_at_all_is_refused(signing) -> None:
    release, _, trust, _ = signing
    envelope = json.loads(_statement(release))
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["sequence"] = 99  # a writer raising the sequence of a genuine statement
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    assert _check(json.dumps(envelope).encode(), trust).failed == "untrusted-signer"
    for junk in (b"", b"{}", b"not json", json.dumps({"payload": "!!", "payloadType": "x", "signatures": []}).encode(),
                 b"x" * 100_000):
        checked = _check(junk, trust)
        assert checked.failed == "unreadable" and checked.detail


def test_the_trust_state_keeps_the_highest_sequence_and_a_bad_file_is_an_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "state" / "trust-state.json"
    with trust_state(path) as state:
        assert state.highest("s3://engines", "m", "prod") is None
        state.saw("s3://engines", "m", "prod", 5)
        state.saw("s3://engines", "m", "prod", 3)
    with trust_state(path) as state:
        assert state.highest("s3://engines", "m", "prod") == 5 and state.highest("/srv/reg", "m", "prod") is None
    with trust_state(path) as state:  # a state from before identities keyed it by the spelling of the registry
        state.seen["atk/h"] = {"m:prod": 7}
        state.adopt("atk/h", "file:///srv/atk/h")
        state.adopt("/srv/reg", "file:///srv/reg")  # nothing kept under that spelling: nothing changes
    with trust_state(path) as state:
        assert state.highest("file:///srv/atk/h", "m", "prod") == 7 and "atk/h" not in state.seen
    path.write_text("{not json")
    with pytest.raises(UserError) as corrupt, trust_state(path):
        pass
    assert corrupt.value.where == str(path) and "corrupt" in corrupt.value.render()
    assert path.read_text() == "{not json"  # left for whoever looks, never silently reset
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(UserError) as unwritable, trust_state(locked / "state.json"):
            pass
        assert str(locked / "state.json") in unwritable.value.where


def test_a_registry_s_identity_does_not_follow_its_spelling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.oci import OciStore
    from registry.s3 import S3Store
    from registry.store import open_store

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    assert S3Store.from_url("s3://engines/prod/", endpoint_url="http://Seaweed:8333/").identity \
        == S3Store.from_url("s3://engines/prod", endpoint_url="http://seaweed:8333").identity
    assert S3Store.from_url("s3://engines/prod").identity != S3Store.from_url(
        "s3://engines/prod", endpoint_url="http://seaweed:8333").identity  # the same bucket on another server
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://seaweed:8333")  # where boto3 sends it when no endpoint is given
    assert S3Store.from_url("s3://engines/prod").identity.endswith("at http://seaweed:8333")
    assert OciStore("oci+http://Registry:5000/team").identity == OciStore("oci://registry:5000/team").identity
    (tmp_path / "reg").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "reg")
    monkeypatch.chdir(tmp_path)
    assert {open_store(s).identity for s in ("reg", f"{tmp_path}/reg", "alias", f"file://{tmp_path}/reg/")} \
        == {f"file://{tmp_path.resolve()}/reg"}
