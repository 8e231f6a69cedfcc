"""What a checkpoint directory holds: architecture, dtype and parameter count, read without torch.

The parameter count comes from the safetensors headers (8-byte little-endian length, then JSON), so a
multi-GB checkpoint is inspected in milliseconds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from enginesmith.core.checkpoints.weight_grid import read_safetensors_header, weight_grid
from enginesmith.core.errors import UserError

if TYPE_CHECKING:
    from enginesmith.core.shapes import ModelShape


def read_config(checkpoint_dir: Path) -> dict[str, Any]:
    path = checkpoint_dir / "config.json"
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        raise UserError("no config.json: this is not a Transformers checkpoint", where=str(checkpoint_dir)) from None
    except json.JSONDecodeError as exc:
        raise UserError(f"config.json is not valid JSON: {exc.msg} (line {exc.lineno})", where=str(path)) from None


def safetensors_parameter_count(path: Path) -> int:
    header, _ = read_safetensors_header(path)
    return sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")


def parameter_count(checkpoint_dir: Path, names: list[str]) -> int | None:
    """The parameters in the safetensors files of ``names`` (the set a runtime loads; None when it has none)."""
    files = [checkpoint_dir / name for name in names if name.endswith(".safetensors")]
    if not files:
        return None
    return sum(safetensors_parameter_count(f) for f in files)


def describe(checkpoint_dir: Path, names: list[str]) -> dict[str, Any]:
    """architecture, model_type, dtype, and the parameter count of ``names``, of a checkpoint directory."""
    config = read_config(checkpoint_dir)
    architectures = config.get("architectures") or [None]
    return {
        "architecture": architectures[0],
        "model_type": config.get("model_type"),
        "dtype": config.get("torch_dtype") or config.get("dtype"),
        "parameter_count": parameter_count(checkpoint_dir, names),
    }


def model_shape(source: str, revision: str = "main", *, fetch: bool = False) -> ModelShape | None:
    """The layer widths of a local directory's or a Hub repo's ``config.json``; for a Hub repo from the local Hub
    cache, or with ``fetch`` downloaded (one small file: what a planner that resolves revisions does, so the
    nightly and build-cell plan a cell alike). None where it cannot be read: planning then keeps the recipes'
    defaults and the quantize stage checks the widths before it loads any weights."""
    local = Path(source.removeprefix("file://")).expanduser()
    try:
        if local.is_dir():
            return directory_shape(local)
        from huggingface_hub import hf_hub_download, try_to_load_from_cache

        from enginesmith.core.secrets import hf_token

        path = (hf_hub_download(source, "config.json", revision=revision, token=hf_token()) if fetch
                else try_to_load_from_cache(source, "config.json", revision=revision))
        if not isinstance(path, str):
            return None
        return directory_shape(Path(path).parent)
    except Exception:
        return None


def directory_shape(directory: Path) -> ModelShape:
    """The shape of a checkpoint directory (a local one, or a Hub cache snapshot) and any quantisation its weights
    carry already: as ``config.json`` or ``provenance.json`` records it, else as a few rows of its weights show it
    (where they are here)."""
    from enginesmith.core.shapes import ModelShape

    provenance = directory / "provenance.json"
    return ModelShape.from_config(read_config(directory),
                                  json.loads(provenance.read_text()) if provenance.is_file() else None,
                                  weight_grid=weight_grid(directory))
