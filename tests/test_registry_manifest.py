"""Manifests and names: what a manifest may contain, and how references parse."""

from __future__ import annotations

import json
import os.path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enginesmith.core.errors import UserError
from registry.errors import IntegrityError, UnsafePathError
from registry.manifest import (
    Manifest,
    parse_manifest,
    unsafe_path_reason,
    utc_timestamp,
    validation_metric,
)
from registry.names import Ref, parse_ref
from tests.registry_helpers import read_artefact, write_artefact


def manifest_json(tmp_path, **changes) -> dict:
    artefact = read_artefact(write_artefact(tmp_path))
    manifest = Manifest(model="tiny-llama", key=artefact.key, published=utc_timestamp(), artefact=artefact)
    document = json.loads(manifest.to_bytes())
    for dotted, value in changes.items():
        target = document
        *parents, last = dotted.split(".")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        target[last] = value
    return document


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../outside", "'..'"),
        ("engine/../../outside", "'..'"),
        ("/etc/passwd", "absolute"),
        ("C:/Windows/evil.dll", "absolute"),
        ("rank0\\..\\evil", "backslash"),
        ("a//b", "empty"),
        ("./a", "'.'"),
        ("", "empty"),
        ("a\x00b", "NUL"),
    ],
)
def test_unsafe_paths_are_refused_with_the_reason(path: str, why: str) -> None:
    reason = unsafe_path_reason(path)
    assert reason is not None and why in reason


@pytest.mark.parametrize("path", ["rank0.engine", "tokenizer/tokenizer.json", "..hidden", "a/b/c.d", "x..y"])
def test_ordinary_relative_paths_are_accepted(path: str) -> None:
    assert unsafe_path_reason(path) is None


@given(st.lists(st.sampled_from(["a", "b.bin", "..", ".", "", "/", "c"]), min_size=1, max_size=6).map("/".join))
def test_an_accepted_path_never_leaves_its_directory(path: str) -> None:
    if unsafe_path_reason(path) is None:
        joined = os.path.normpath(os.path.join("/dest", path))
        assert joined.startswith("/dest/")


@pytest.mark.parametrize("bad_path", ["../../.bashrc", "/tmp/evil"])
def test_a_manifest_whose_paths_escape_is_refused(tmp_path, bad_path: str) -> None:
    document = manifest_json(tmp_path, **{"artefact.files.0.path": bad_path})
    with pytest.raises(UnsafePathError) as caught:
        parse_manifest(json.dumps(document).encode(), "registry/manifests/tiny-llama/k.json")
    message = caught.value.render()
    assert "registry/manifests/tiny-llama/k.json" in message
    assert "artefact.files[0]" in message and bad_path in message


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ([("a.bin", 1), ("a.bin", 1)], "listed twice"),
        ([("a", 1), ("a/b.bin", 1)], "which is a file"),
        ([("a/b.bin", 1), ("a", 1)], "also a directory"),
        ([("artefact.json", 1)], "reserved"),
        ([("Artefact.JSON", 1)], "reserved"),
        ([("Model.bin", 1), ("model.bin", 1)], "same file as 'Model.bin' where file names ignore case"),
        ([("caf\u00e9.bin", 1), ("cafe\u0301.bin", 1)], "same file as 'caf\u00e9.bin'"),
        ([("Weights", 1), ("weights/a.bin", 1)], "lies under 'Weights', which is a file"),
    ],
)
def test_file_lists_that_cannot_be_laid_out_are_refused(tmp_path, files, expected: str) -> None:
    document = manifest_json(tmp_path)
    document["artefact"]["files"] = [{"path": p, "size": s, "sha256": "0" * 64} for p, s in files]
    with pytest.raises(UnsafePathError, match=expected):
        parse_manifest(json.dumps(document).encode(), "m.json")


def test_a_file_without_a_sha256_is_refused(tmp_path) -> None:
    document = manifest_json(tmp_path, **{"artefact.files.0.sha256": None})
    with pytest.raises(IntegrityError, match=r"files\[0\].*needs a sha256") as caught:
        parse_manifest(json.dumps(document).encode(), "m.json")
    assert not isinstance(caught.value, UnsafePathError)


def test_a_newer_schema_names_both_versions_and_asks_for_an_upgrade(tmp_path) -> None:
    from enginesmith import __version__

    document = manifest_json(tmp_path, schema_version=4, published_by="9.1.0")
    with pytest.raises(IntegrityError) as caught:
        parse_manifest(json.dumps(document).encode(), "m.json")
    assert "schema 4, published by enginesmith 9.1.0" in caught.value.message
    assert f"enginesmith {__version__} reads" in caught.value.message
    assert caught.value.hint == "upgrade enginesmith: pip install --upgrade 'enginesmith>=9.1.0'"


def test_a_schema_1_manifest_still_reads_and_new_ones_say_who_published_them(tmp_path) -> None:
    from enginesmith import __version__
    from registry.local import LocalStore
    from registry.publish import publish_artefact

    old = parse_manifest(json.dumps(manifest_json(tmp_path, schema_version=1)).encode(), "m.json")
    assert old.schema_version == 1 and old.published_by is None
    store = LocalStore(tmp_path / "registry")
    published = publish_artefact(store, write_artefact(tmp_path / "build"))
    body = store.read_manifest(published.model, published.key)
    assert body is not None
    manifest = parse_manifest(body, "m.json")
    assert manifest.schema_version == 2 and manifest.published_by == __version__


def test_a_damaged_manifest_names_the_field(tmp_path) -> None:
    document = manifest_json(tmp_path, **{"artefact.tp": "two"})
    with pytest.raises(IntegrityError, match=r"artefact\.tp"):
        parse_manifest(json.dumps(document).encode(), "m.json")
    with pytest.raises(IntegrityError, match="not valid JSON"):
        parse_manifest(b"{", "m.json")


def test_a_manifest_round_trips_through_its_bytes(tmp_path) -> None:
    document = manifest_json(tmp_path)
    manifest = parse_manifest(json.dumps(document).encode(), "m.json")
    assert parse_manifest(manifest.to_bytes(), "m.json") == manifest
    assert manifest.total_bytes == sum(f.size for f in manifest.artefact.files)
    # tokenizer.json and extra/tokenizer.json hold the same bytes: one blob
    assert len(manifest.files_by_digest()) == len(manifest.artefact.files) - 1


def test_validation_metric_reads_the_objectives_number() -> None:
    from tests.report_factory import llm_report

    report = llm_report([1.0, 1.0, 1.0], tpot_ms=7.0)  # the candidate's c=4 level is its best: 3 × 100 tok/s
    assert validation_metric(report, "throughput") == 300.0
    assert validation_metric(report, "latency") == 7.0
    assert validation_metric(None, "throughput") is None
    damaged = {**report, "comparison": {**report["comparison"], "candidate": "fast"}}
    assert validation_metric(damaged, "throughput") is None
    assert validation_metric({"kind": "speech"}, "latency") is None  # a kind nothing here registered


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("tiny-llama", Ref("tiny-llama")),
        ("tiny-llama:stable", Ref("tiny-llama", channel="stable")),
        ("tiny-llama@947f888d", Ref("tiny-llama", key="947f888d")),
    ],
)
def test_references_parse(text: str, expected: Ref) -> None:
    assert parse_ref(text) == expected
    assert str(parse_ref(text)) == text


@pytest.mark.parametrize("text", ["../etc", "tiny-llama@abc", "tiny:../x", "a b", "tiny@key/../x"])
def test_bad_references_are_user_errors(text: str) -> None:
    with pytest.raises(UserError):
        parse_ref(text)
