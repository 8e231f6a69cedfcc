"""Content digests of files and directories (streamed; no whole file in memory)."""

from __future__ import annotations

import hashlib
from pathlib import Path

CHUNK_BYTES = 4 * 1024 * 1024


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def directory_digest(root: Path, names: list[str] | None = None) -> str:
    """``sha256:<hex>`` over (relative path, size, sha256) of every regular file under ``root`` (or ``names``)."""
    relative_paths = names if names is not None else sorted(
        str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.is_symlink()
    )
    manifest = hashlib.sha256()
    for relative in sorted(relative_paths):
        path = root / relative
        manifest.update(f"{relative}\0{path.stat().st_size}\0{file_sha256(path)}\n".encode())
    return "sha256:" + manifest.hexdigest()
