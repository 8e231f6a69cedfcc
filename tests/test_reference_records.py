"""#63 item 1: the reference's results as a create-once record per reference key in the registry's history, reused
by every candidate of that key on any node (the nightly's own reuse is proven in tests/test_flows.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from pipeline.common import reference_records as kept_records
from registry.history import load_history
from registry.reference_records import ReferenceRecord, read_reference_record, reference_entry, write_reference_record
from registry.store import open_store

KEY = "a" * 64
RESULTS = {"accuracy": [], "completions": ["4"], "perplexity": None, "requests": 2,
           "answers": {"facts/enginesmith": [True, False]}}


def _record(key: str = KEY, **update: object) -> ReferenceRecord:
    fields = {"key": key, "model": "tiny-llama", "measured_at": "2026-12-07T01:00:00+00:00",
              "measured_by": "tiny-llama/fp8/cpu/tp1/hf-quantized", "results": RESULTS, **update}
    return ReferenceRecord.model_validate(fields)


def test_a_record_is_written_once_and_read_back_only_under_its_own_key(tmp_path: Path):
    store = open_store(str(tmp_path / "registry"))
    assert read_reference_record(store, "tiny-llama", KEY) is None
    assert write_reference_record(store, _record()) is True
    assert write_reference_record(store, _record(measured_by="another cell")) is False  # the first stays
    assert read_reference_record(store, "tiny-llama", KEY) == _record()
    assert read_reference_record(store, "tiny-llama", "b" * 64) is None
    assert read_reference_record(store, "other-model", KEY) is None
    # An entry whose record names another key (the first 32 characters alike) is never reused.
    other = KEY[:32] + "b" * 32
    assert read_reference_record(store, "tiny-llama", other) is None
    # The history of cell runs reads past it.
    history = load_history(store, "tiny-llama")
    assert not history.cells and not history.unreadable
    assert store.list_history("tiny-llama") == [reference_entry(KEY)]


def test_a_record_that_cannot_be_read_is_not_reused(tmp_path: Path):
    store = open_store(str(tmp_path / "registry"))
    store.create_history("tiny-llama", reference_entry(KEY), b"{not json")
    assert read_reference_record(store, "tiny-llama", KEY) is None


def test_what_one_node_measured_is_laid_into_another_nodes_cache_with_who_measured_it(tmp_path: Path):
    registry = str(tmp_path / "registry")
    first_cache = tmp_path / "node-a" / "reference" / "k.json"
    first_cache.parent.mkdir(parents=True)
    first_cache.write_text(json.dumps(RESULTS))
    kept = kept_records.keep(registry, "tiny-llama", KEY, first_cache, measured_by="tiny-llama/fp8/cpu/tp1/x",
                             measured_now=True)
    assert kept is not None and not kept.reused and kept.measured_by == "tiny-llama/fp8/cpu/tp1/x"
    assert "measured in this run" in kept.describe()

    second_cache = tmp_path / "node-b" / "reference" / "k.json"
    fetched = kept_records.fetch(registry, "tiny-llama", KEY, second_cache)
    assert fetched is not None and fetched.reused and fetched.measured_at == kept.measured_at
    assert json.loads(second_cache.read_text()) == RESULTS
    assert "reused from the record" in fetched.describe() and "tiny-llama/fp8/cpu/tp1/x" in fetched.describe()
    assert kept_records.fetch(registry, "tiny-llama", "c" * 64, tmp_path / "none.json") is None
    assert not (tmp_path / "none.json").exists()
    # Nothing whole to record (the validation stopped before the reference answered): nothing is written.
    assert kept_records.keep(registry, "tiny-llama", "c" * 64, tmp_path / "none.json", measured_by="x",
                             measured_now=True) is None


def test_a_registry_that_cannot_be_used_costs_only_the_reuse(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    not_a_directory = tmp_path / "registry"
    not_a_directory.write_text("a file where the registry should be")
    cache = tmp_path / "reference" / "k.json"
    cache.parent.mkdir()
    cache.write_text(json.dumps(RESULTS))
    with caplog.at_level(logging.WARNING):
        assert kept_records.fetch(str(not_a_directory), "tiny-llama", KEY, tmp_path / "other.json") is None
        assert kept_records.keep(str(not_a_directory), "tiny-llama", KEY, cache, measured_by="x",
                                 measured_now=True) is None
    assert "the reference is measured here" in caplog.text and "the next run measures it again" in caplog.text
    assert json.loads(cache.read_text()) == RESULTS  # the node's own cache is untouched
