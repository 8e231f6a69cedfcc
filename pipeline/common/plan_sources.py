"""The I/O edge of planning: load a config, find each model's source, resolve what it is now and read its shape,
then hand all of it to the pure ``plan_matrix``. The CLI's ``plan`` and the flows both plan through here, so a
cell gets the same key whoever plans it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from enginesmith.core.assets import task_fingerprints
from enginesmith.core.calibration import calibration_fingerprint
from enginesmith.core.checkpoints.inspect import model_shape
from enginesmith.core.checkpoints.pull import cached_revision, local_checkpoint, resolve_revision
from enginesmith.core.config import Catalogue, load_pipeline_config
from enginesmith.core.errors import ConfigError
from enginesmith.core.plan import LOCAL_MODEL_HINT, Plan, plan_matrix
from enginesmith.core.shapes import ModelShape
from enginesmith.core.specs import CheckpointSourceSpec, PipelineConfig, is_commit_sha
from pipeline.common.protocol import PlannedCell


def model_source(model: CheckpointSourceSpec, config_dir: Path) -> str:
    """Where a model comes from: a Hub repo id, or a local directory (relative to the config file's folder)."""
    if not model.is_local:
        return model.repo
    local = Path(model.repo.removeprefix("file://")).expanduser()
    return str(local if local.is_absolute() else (config_dir / local).resolve())


def hub_revision(source: str, revision: str, *, resolve_hub: bool) -> str | None:
    """The commit a Hub model's revision is keyed by: with ``resolve_hub`` what the Hub says (the cache when
    offline), as the nightly resolves it; without, what the local Hub cache says (no network), as preflight reads it
    offline, so ``plan`` and ``support`` show the keys a night offline builds. None where the cache has no snapshot
    of it: the branch is then keyed by its name and the cell says its revision is not pinned."""
    return resolve_revision(source, revision) if resolve_hub else cached_revision(source, revision)


def hub_revision_notes(config: PipelineConfig, cells: Iterable[PlannedCell]) -> list[str]:
    """What the keys of each Hub model whose config names a branch rest on, a line each: the commit the local Hub
    cache resolved it to, or the branch's name where it could not be resolved."""
    sources = {source.id: source for source in [*config.models, *config.encoders]}
    keyed = {cell.model.id: cell.source_revision for cell in cells if not cell.model.is_local}
    notes = []
    for model_id, revision in sorted(keyed.items()):
        source = sources[model_id]
        if is_commit_sha(source.revision):
            continue
        where = f"{source.repo}@{source.revision}"
        notes.append(f"{where} is {revision[:12]} in the local Hub cache: its keys are over that commit"
                     if is_commit_sha(revision) else
                     f"{where} is not in the local Hub cache: its keys are over the unresolved branch "
                     f"{source.revision!r}, not over the commit a night builds (pull the model once, or pin a "
                     "commit sha in the config)")
    return notes


def plan_loaded(config: PipelineConfig, config_dir: Path, catalogue: Catalogue, *, resolve_hub: bool = True) -> Plan:
    """Plan a loaded config. Local directories are always keyed by their content digest (the same digest the
    pull records); Hub revisions are resolved to commit shas as ``hub_revision`` says."""
    revisions: dict[str, str] = {}
    shapes: dict[str, ModelShape] = {}
    for model in config.models:
        source = model_source(model, config_dir)
        if model.is_local:
            if not Path(source).is_dir():
                raise ConfigError("local model directory not found", path=source, field=f"models.{model.id}.repo",
                                  hint=LOCAL_MODEL_HINT)
            revisions[model.id] = local_checkpoint(Path(source), allow_pickle=model.allow_pickle,
                                                   trust_remote_code=model.trust_remote_code).commit_sha
        else:
            resolved = hub_revision(source, model.revision, resolve_hub=resolve_hub)
            if resolved is not None:
                revisions[model.id] = resolved
        shape = model_shape(source, revisions.get(model.id, model.revision), fetch=resolve_hub)
        if shape is not None:
            shapes[model.id] = shape
    return plan_matrix(config, catalogue, calibration_fingerprint=calibration_fingerprint(config.calibration.dataset),
                       source_revisions=revisions, model_shapes=shapes,
                       task_fingerprints=task_fingerprints(config.workload.accuracy_tasks))


def plan_config(config_path: Path, catalogue: Catalogue, *,
                resolve_hub: bool = True) -> tuple[PipelineConfig, Plan]:
    config = load_pipeline_config(config_path, catalogue)
    return config, plan_loaded(config, config_path.parent, catalogue, resolve_hub=resolve_hub)
