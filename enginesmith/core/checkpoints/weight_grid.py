"""Whether a checkpoint's weights already sit on a coarse grid, read from a few rows of a few linear layers.

Weights dequantised from a block-quantised copy (a GGUF's Q4_K_M, a 4-bit AWQ export folded back) keep their grid:
each block of 32 along a row holds at most 2^bits distinct values (a scale and an offset per block, times 0..15 for
4 bits), where a trained BF16 layer's block holds about 30 of 32. The count is of the stored values' bit patterns, so
no float is decoded and neither torch nor numpy is needed: a few KB read from the safetensors files decides it.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any

from pydantic import BaseModel

GRID_BLOCK = 32  # GGUF's k-quant sub-blocks and Q4_0/Q4_1 blocks; AWQ's groups are a multiple of it
SAMPLED_KINDS = 8
SAMPLED_ROWS = 4
VALUE_BYTES = {"BF16": 2, "F16": 2, "F32": 4}
# A layer counts as on a grid when no sampled block has more distinct values than a 4-bit grid allows, and some block
# has more than two (an all-zero or constant layer, as some initialisations leave, is no evidence of a grid).
MAX_GRID_VALUES, MIN_EVIDENCE_VALUES = 16, 3
NOT_LINEAR = ("embed", "lm_head", "norm", "wte", "wpe")
Location = tuple[Path, dict[str, Any], int]  # a tensor's file, its header entry, where the file's data starts


class WeightGrid(BaseModel):
    """The evidence that a checkpoint's weights were quantised before: one layer whose sampled blocks all sit on a
    grid of at most ``distinct_per_block`` values."""

    tensor: str
    file: str
    rows_sampled: int
    block: int
    distinct_per_block: int  # the most distinct values found in any sampled block

    @property
    def weight_bits(self) -> int:
        return max(1, math.ceil(math.log2(self.distinct_per_block)))

    def describe(self) -> str:
        return (f"{self.tensor} ({self.file}) has at most {self.distinct_per_block} distinct values in each block of "
                f"{self.block} along {self.rows_sampled} sampled rows: a {self.weight_bits}-bit grid, as weights "
                "dequantised from a quantised copy keep")


def read_safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """A safetensors file's header (tensor name → dtype, shape, data_offsets) and where its data starts."""
    with path.open("rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        return json.loads(handle.read(header_len)), 8 + header_len


def weight_grid(directory: Path) -> WeightGrid | None:
    """The first sampled linear layer (one of each kind: q_proj, …, down_proj, from a middle layer) whose weights sit
    on a grid of at most 16 values per block; None where none does, or where the weight files are not here (an index
    whose shards are not cached)."""
    for name, (path, entry, data_start) in _one_of_each_kind(_linear_tensors(directory)):
        distinct = _most_distinct_per_block(path, entry, data_start)
        if distinct is not None and MIN_EVIDENCE_VALUES <= distinct <= MAX_GRID_VALUES:
            return WeightGrid(tensor=name, file=path.name, rows_sampled=min(SAMPLED_ROWS, entry["shape"][0]),
                              block=GRID_BLOCK, distinct_per_block=distinct)
    return None


def _weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if (directory / "model.safetensors").is_file():
        return [directory / "model.safetensors"]
    if not index.is_file():
        return []
    try:
        shards = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
    except (OSError, ValueError, AttributeError):
        return []
    return [directory / shard for shard in shards if (directory / shard).is_file()]


def _linear_tensors(directory: Path) -> list[tuple[str, Location]]:
    """The 2-D weights of float dtype, rows at least two blocks wide, by name (embeddings and the head excluded)."""
    found: dict[str, Location] = {}
    for path in _weight_files(directory):
        try:
            header, data_start = read_safetensors_header(path)
        except (OSError, ValueError, struct.error):
            continue
        for name, entry in header.items():
            shape = entry.get("shape") if isinstance(entry, dict) else None
            if (name.endswith(".weight") and not any(part in name for part in NOT_LINEAR) and shape
                    and len(shape) == 2 and shape[1] >= 2 * GRID_BLOCK and entry.get("dtype") in VALUE_BYTES):
                found[name] = (path, entry, data_start)
    return sorted(found.items())


def _one_of_each_kind(linears: list[tuple[str, Location]]) -> list[tuple[str, Location]]:
    """A middle layer's tensor of each kind (its name with the layer and expert numbers taken out): a GGUF quantises
    kinds differently (Q4_K_M keeps some v_proj and down_proj at 6 bits, and a width k-quants cannot block at 5), so
    each kind is a separate witness."""
    kinds: dict[str, list[tuple[str, Location]]] = {}
    for name, location in linears:
        kinds.setdefault(re.sub(r"\.\d+\.", ".N.", name), []).append((name, location))
    return [members[len(members) // 2] for _, members in sorted(kinds.items())][:SAMPLED_KINDS]


def _most_distinct_per_block(path: Path, entry: dict[str, Any], data_start: int) -> int | None:
    rows, width = entry["shape"]
    size = VALUE_BYTES[entry["dtype"]]
    row_bytes, block_bytes = width * size, GRID_BLOCK * size
    most = 0
    with path.open("rb") as handle:
        for row in sorted({row * (rows - 1) // max(1, SAMPLED_ROWS - 1) for row in range(SAMPLED_ROWS)}):
            handle.seek(data_start + entry["data_offsets"][0] + row * row_bytes)
            data = handle.read(row_bytes - row_bytes % block_bytes)
            for start in range(0, len(data), block_bytes):
                block = data[start:start + block_bytes]
                most = max(most, len({block[i:i + size] for i in range(0, block_bytes, size)}))
                if most > MAX_GRID_VALUES:
                    return most
    return most or None
