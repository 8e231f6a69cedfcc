"""Stage keys: sha256 over the canonical JSON of everything that determines a stage's output.

Same key ⇒ same output ⇒ no work. That is what makes nightly builds incremental and lets one quantised
checkpoint serve many SKUs. What goes into each key (and nothing else):

- checkpoint: the source (Hub repo id and resolved commit sha; or a local directory's content digest).
- quantize: the checkpoint key; the recipe (ModelOpt config, KV-cache quantisation, AWQ block size, quant
  algos); the calibration set (fingerprint of its content, sample count, sequence length, batch size); the
  exporter's versions (ModelOpt, torch, transformers — for engine cells the ModelOpt of the TensorRT-LLM
  image); the tensor/pipeline-parallel mapping of the TensorRT-LLM checkpoint; the fixes the stage applies to
  that recipe's exported weights (``enginesmith.core.plan.export_fixes``).
- build: the quantize key; the artefact kind; the target SKU id and its SM; the resolved build profile (the
  matrix's explicit values over the SKU defaults); the builder's versions (TensorRT-LLM, TensorRT, CUDA).
- validate: the build key; the reference checkpoint key; the reference runtime's version; the workload;
  the gates that apply to this recipe. This is the cell's final key, the one the registry is keyed by.

Not in any key: paths, timestamps, host names, dict order (canonical JSON sorts keys).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

# Bump when a stage's code changes what it produces for the same inputs.
KEY_SCHEMA_VERSION = 1


def canonical_json(value: Any) -> str:
    """JSON with sorted keys, no whitespace, Pydantic models dumped in JSON mode; stable across runs and hosts."""
    return json.dumps(_plain(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(_plain(v) for v in value)
    return value


def sha256_hex(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def stage_key(stage: str, inputs: dict[str, Any]) -> str:
    """The key of one stage: sha256 of the canonical JSON of its name, the key schema and its inputs."""
    return sha256_hex(canonical_json({"stage": stage, "key_schema": KEY_SCHEMA_VERSION, "inputs": inputs}))


def short(key: str) -> str:
    return key[:12]
