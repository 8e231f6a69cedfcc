"""Facts that are slow to learn and never change for the same inputs, kept as small JSON files between runs: what
vLLM's parser says of an argv (for one vLLM version), lm-eval's task index (for one lm-eval install).

They live under the enginesmith cache (``$ENGINESMITH_CACHE_DIR``, else the user's cache directory, beside the blob
cache of pulls), one file per fact, named by a digest of everything the fact depends on. A damaged or unreadable entry
reads as missing and is learned again; an entry that cannot be written only costs the next run the slow way.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

from enginesmith.core.staging import write_whole
from enginesmith.core.state import CACHE_ENV
from enginesmith.core.state import cache_dir as cache_root

__all__ = ["CACHE_ENV", "cache_root", "fact_path", "read_fact", "write_fact"]


def fact_path(kind: str, *identity: Any, root: Path | None = None) -> Path:
    """Where the fact of ``kind`` for ``identity`` (anything JSON can write) is kept."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()
    return (root or cache_root()) / kind / f"{digest}.json"


def read_fact(path: Path) -> Any | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_fact(path: Path, fact: Any) -> None:
    """Write ``fact`` whole or not at all (a temporary file renamed over the entry); a cache that cannot be written
    is not an error."""
    with contextlib.suppress(OSError):
        write_whole(path, json.dumps(fact))
