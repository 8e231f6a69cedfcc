"""The local blob cache that pulls share: verified blobs by digest, partial downloads, and pulled artefacts.

```
<cache>/blobs/sha256/<hex>            verified, read-only; pulled artefacts hard-link to these
<cache>/partial/<hex>.part            an unfinished download; a later pull continues it
<cache>/partial/<hex>.lock            held while one process downloads that blob
<cache>/artefacts/<model>/<key16>/    the default destination of a pull
```
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from pathlib import Path

from enginesmith.locks import exclusive

CACHE_ENV = "ENGINESMITH_CACHE_DIR"
DEFAULT_CACHE_DIR = ".enginesmith/cache"
READ_ONLY = 0o444


def default_cache_dir() -> Path:
    """``$ENGINESMITH_CACHE_DIR``, else ``.enginesmith/cache`` (next to the default registry)."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR)


class BlobCache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def blob(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / digest

    def part(self, digest: str) -> Path:
        return self.root / "partial" / f"{digest}.part"

    def has(self, digest: str, size: int) -> bool:
        try:
            return self.blob(digest).stat().st_size == size
        except FileNotFoundError:
            return False

    def partial_bytes(self, digest: str) -> int:
        try:
            return self.part(digest).stat().st_size
        except FileNotFoundError:
            return 0

    def default_dest(self, model: str, key: str) -> Path:
        return self.root / "artefacts" / model / key[:16]

    def commit(self, digest: str) -> Path:
        """Move a verified partial download into place, read-only (pulled files are hard links to it)."""
        final = self.blob(digest)
        final.parent.mkdir(parents=True, exist_ok=True)
        part = self.part(digest)
        part.chmod(READ_ONLY)
        os.replace(part, final)
        return final

    def locked(self, digest: str) -> AbstractContextManager[None]:
        """Hold the download of one blob, so two pulls sharing this cache never append to the same partial file."""
        return exclusive(self.root / "partial" / f"{digest}.lock")
