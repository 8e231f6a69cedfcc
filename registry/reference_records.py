"""The reference's deterministic results as a create-once record in the registry's history (#63 item 1).

A BF16 reference's accuracy answers (per question), greedy completions and perplexity depend only on its reference
key: the model's revision, the SKU, tp/pp, the reference runtime and its version, the workload and the accuracy tasks
(``pipeline.kinds.llm_steps``). Every candidate of that key, tonight's other cells, later nights and other nodes,
reuses them instead of asking the reference again. The record is written once, by the first run that measured
them (a second write changes nothing, as for every history record), and a record whose key is not the one asked for
is never reused. What it holds is the validation stage's own results, carried as JSON: the registry does not read
them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from registry.history import REFERENCE_ENTRY_PREFIX
from registry.store import RegistryStore

KEY_CHARS = 32


class ReferenceRecord(BaseModel):
    """One reference key's results, who measured them and when."""

    schema_version: Literal[1] = 1
    key: str  # the reference key, whole
    model: str
    measured_at: str  # UTC, ISO 8601
    measured_by: str  # the cell whose run measured them
    results: dict[str, Any]  # the validation stage's SideAccuracy, as it writes it


def reference_entry(key: str) -> str:
    return f"{REFERENCE_ENTRY_PREFIX}{key[:KEY_CHARS]}"


def read_reference_record(store: RegistryStore, model: str, key: str) -> ReferenceRecord | None:
    """The record of ``key``, or None: none written, or one that cannot be read or names another key (never
    reused: its answers would be another reference's)."""
    body = store.read_history(model, reference_entry(key))
    if body is None:
        return None
    try:
        record = ReferenceRecord.model_validate_json(body)
    except ValidationError:
        return None
    return record if record.key == key and record.model == model else None


def write_reference_record(store: RegistryStore, record: ReferenceRecord) -> bool:
    """Create the record unless its key has one already; True if this call wrote it."""
    return store.create_history(record.model, reference_entry(record.key), record.model_dump_json().encode())
