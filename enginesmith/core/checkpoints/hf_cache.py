"""Write any checkpoint directory into the Hugging Face cache layout, so tests and the demo go through
huggingface_hub's own offline resolution (``HF_HUB_OFFLINE=1``) instead of around it.

Layout (as huggingface_hub writes it)::

    <cache>/models--<org>--<name>/blobs/<etag>              file contents; LFS etag = sha256, else git sha1
    <cache>/models--<org>--<name>/snapshots/<commit>/<file>  relative symlink to ../../blobs/<etag>
    <cache>/models--<org>--<name>/refs/<branch>              the commit sha
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from enginesmith.core.checkpoints.digest import directory_digest, file_sha256

# The Hub stores files above this size (and all weights) in LFS, whose etag is the content's sha256.
LFS_THRESHOLD_BYTES = 10 * 1024 * 1024
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".model")


def repo_folder_name(repo_id: str) -> str:
    return "models--" + repo_id.replace("/", "--")


def _git_blob_sha1(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _etag(path: Path) -> str:
    if path.suffix in LFS_SUFFIXES or path.stat().st_size > LFS_THRESHOLD_BYTES:
        return file_sha256(path)
    return _git_blob_sha1(path)


def write_hf_cache(checkpoint_dir: Path, repo_id: str, cache_dir: Path, *, branch: str = "main",
                   commit_sha: str | None = None) -> str:
    """Put ``checkpoint_dir``'s files into ``cache_dir`` as ``repo_id`` at ``branch``; returns the commit sha.

    The commit sha is ``commit_sha`` where given (a snapshot of a real repo's pinned commit), else derived from the
    directory's content, so the same files always give the same commit. Writing twice is a no-op.
    """
    names = sorted(str(p.relative_to(checkpoint_dir)) for p in checkpoint_dir.rglob("*") if p.is_file())
    commit_sha = commit_sha or hashlib.sha1(directory_digest(checkpoint_dir, names).encode(),
                                            usedforsecurity=False).hexdigest()
    repo_dir = cache_dir / repo_folder_name(repo_id)
    blobs, snapshot = repo_dir / "blobs", repo_dir / "snapshots" / commit_sha
    blobs.mkdir(parents=True, exist_ok=True)
    for name in names:
        source = checkpoint_dir / name
        etag = _etag(source)
        blob = blobs / etag
        if not blob.exists():
            partial = blob.with_suffix(".incomplete")
            partial.write_bytes(source.read_bytes())
            partial.replace(blob)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(blob, link.parent))
    refs = repo_dir / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / branch).write_text(commit_sha)
    return commit_sha
