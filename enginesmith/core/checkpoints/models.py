"""The typed result of the pull stage."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from enginesmith.core.keys import stage_key

LOCAL_SOURCE = "local"


class CheckpointFile(BaseModel):
    path: str
    size: int
    sha256: str | None = None  # from the Hub's LFS metadata (or the cache's blob name) where available


class Checkpoint(BaseModel):
    """A checkpoint on local disk, pinned: a Hub repo at a commit sha, or a local directory at a content digest."""

    source: Literal["hub", "local"]
    repo_id: str
    requested_revision: str
    commit_sha: str  # the Hub commit; for a local directory, its "sha256:<digest>"
    local_path: str
    files: list[CheckpointFile]
    total_bytes: int
    architecture: str | None
    model_type: str | None
    dtype: str | None
    parameter_count: int | None

    @property
    def parameters(self) -> int:
        """The parameter count read from the weights, else estimated from their size as a 16-bit checkpoint."""
        return self.parameter_count or self.total_bytes // 2

    @property
    def key(self) -> str:
        return checkpoint_key(LOCAL_SOURCE if self.source == "local" else self.repo_id, self.commit_sha)


def checkpoint_key(source_id: str, resolved_revision: str) -> str:
    """The checkpoint stage key: a Hub repo id and commit sha, or ``local`` and the directory's content digest
    (a local checkpoint is the same wherever it lies)."""
    return stage_key("checkpoint", {"repo": source_id, "revision": resolved_revision})
