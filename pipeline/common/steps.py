"""What every kind's cell run shares, as plain functions (no Prefect here): the work directory, the registry,
pulling the checkpoint the plan keyed, and publishing. Each kind's own stages are in ``pipeline.kinds``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from enginesmith.core.checkpoints.models import Checkpoint
from enginesmith.core.checkpoints.pull import pull_checkpoint
from enginesmith.core.errors import UserError
from enginesmith.core.specs import CheckpointSourceSpec, PipelineConfig
from enginesmith.core.state import WORK_ENV, writable_dir
from pipeline.common.plan_sources import model_source

if TYPE_CHECKING:
    from registry.publish import PublishResult
    from registry.signing import SigningKey

QUANTIZED_DIR, ARTEFACTS_DIR, REPORTS_DIR, REFERENCE_DIR = "quantized", "artefacts", "reports", "reference"


def workdir(config: PipelineConfig) -> Path:
    """The work directory stage outputs go to (made here; one that cannot be written is a UserError naming it)."""
    configured = os.environ.get(WORK_ENV)
    return writable_dir(Path(configured or config.workdir), what="work",
                        variable=WORK_ENV if configured else f"workdir (the config's; or {WORK_ENV})")


def registry_url(config: PipelineConfig) -> str:
    return os.environ.get("ENGINESMITH_REGISTRY", config.registry.url)


class PinnedSource(Protocol):
    """A planned cell's checkpoint source and what the plan resolved it to."""

    @property
    def model(self) -> CheckpointSourceSpec: ...

    @property
    def source_revision(self) -> str: ...

    @property
    def revision_pinned(self) -> bool: ...


def pull(config_path: Path, cell: PinnedSource, *, allow_pickle: bool = False,
         trust_remote_code: bool = False) -> Checkpoint:
    """The checkpoint the cell was planned and keyed on: a Hub model at the commit the plan resolved (a branch
    that moved since is not followed), a local directory only while its content is what the plan digested."""
    model = cell.model
    source = model_source(model, config_path.parent)
    checkpoint = pull_checkpoint(source, model.revision if model.is_local else cell.source_revision,
                                 allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    if cell.revision_pinned and checkpoint.commit_sha != cell.source_revision:
        raise UserError(f"{model.id} changed after it was planned: planned {cell.source_revision[:19]}, found "
                        f"{checkpoint.commit_sha[:19]}", where=source,
                        hint="leave the model alone while a cell builds; the next nightly plans and keys the new "
                             "content")
    return checkpoint


class PublishedKeys:
    """Which keys the config's registry holds, listed once per model when first asked (a night of cached cells
    reads the registry once per model, not once per cell)."""

    def __init__(self, config: PipelineConfig) -> None:
        from registry.store import open_store

        self._store = open_store(registry_url(config))
        self._keys: dict[str, frozenset[str]] = {}

    def has(self, model_id: str, key: str) -> bool:
        if model_id not in self._keys:
            self._keys[model_id] = frozenset(self._store.list_manifest_keys(model_id))
        return key in self._keys[model_id]


def published(config: PipelineConfig, model_id: str, key: str) -> bool:
    """Is a cell's final key already in the registry (so it costs no GPU time)?"""
    from registry.store import open_store

    return open_store(registry_url(config)).read_manifest(model_id, key) is not None


def _signing_key(config: PipelineConfig) -> SigningKey | None:
    signing = config.registry.signing
    if signing is None:
        return None
    from registry.signing import load_signing_key

    return load_signing_key(key_file=Path(signing.key_file) if signing.key_file else None, key_env=signing.key_env,
                            passphrase_env=signing.passphrase_env, where="registry.signing")


def publish(key: str, artefact_dir: Path, report_json: dict[str, object], config: PipelineConfig) -> PublishResult:
    from registry.publish import publish_artefact
    from registry.store import open_store

    return publish_artefact(open_store(registry_url(config)), artefact_dir, key=key, validation=report_json,
                            signing_key=_signing_key(config))


def renew_latest_statements(config: PipelineConfig, models: list[str]) -> list[str]:
    """With a signing key configured, keep each model's ``latest`` vouched for on a night that moved nothing: sign
    its statement again where the newest does not name where ``latest`` points or has less than half its time left
    (``registry.channel_statements.ChannelSigner.settle``). Returns ``model:latest → sequence`` for each renewed."""
    signing_key = _signing_key(config)
    if signing_key is None:
        return []
    from registry.channel_statements import ChannelSigner
    from registry.store import open_store

    store = open_store(registry_url(config))
    signer = ChannelSigner(store, signing_key)
    renewed = []
    for model in sorted(set(models)):
        ref = store.read_ref(model, "latest")
        claim = signer.settle(model, "latest", ref.key) if ref is not None else None
        if claim is not None:
            renewed.append(f"{model}:latest → statement {claim.sequence}")
    return renewed
