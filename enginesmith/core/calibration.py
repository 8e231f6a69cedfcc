"""The calibration set's fingerprint, as it enters the quantize key (the loading itself is in quantization/)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from enginesmith.core.assets import BUILTIN_PREFIX, builtin_calibration_path
from enginesmith.core.errors import ConfigError


def calibration_source_path(dataset: str) -> Path | None:
    """The local file behind ``dataset`` ('builtin:<name>' or a path), or None for a Hub dataset id."""
    if dataset.startswith(BUILTIN_PREFIX):
        return builtin_calibration_path(dataset.removeprefix(BUILTIN_PREFIX))
    path = Path(dataset).expanduser()
    if dataset.startswith(("/", "./", "../", "~")) or path.suffix in {".txt", ".jsonl", ".json"}:
        if not path.is_file():
            raise ConfigError("calibration file not found", path=path, field="calibration.dataset",
                              hint="give a text or JSONL file, 'builtin:<name>' or a Hub dataset id")
        return path
    return None


def calibration_fingerprint(dataset: str) -> str:
    """``sha256:<hex>`` of a local calibration file's bytes; ``hub:<id>`` for a Hub dataset (hashed when loaded)."""
    path = calibration_source_path(dataset)
    if path is None:
        return f"hub:{dataset}"
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()
