"""The I/O edge of planning: load a config, find each model's source, resolve what it is now and read its shape,
then hand all of it to the pure ``plan_matrix``. The CLI's ``plan`` and the flows both plan through here, so a
cell gets the same key whoever plans it."""

from __future__ import annotations

from pathlib import Path

from enginesmith.core.assets import task_fingerprints
from enginesmith.core.calibration import calibration_fingerprint
from enginesmith.core.checkpoints.inspect import model_shape
from enginesmith.core.checkpoints.pull import local_checkpoint, resolve_revision
from enginesmith.core.config import Catalogue, load_pipeline_config
from enginesmith.core.errors import ConfigError
from enginesmith.core.plan import LOCAL_MODEL_HINT, Plan, plan_matrix
from enginesmith.core.shapes import ModelShape
from enginesmith.core.specs import CheckpointSourceSpec, PipelineConfig


def model_source(model: CheckpointSourceSpec, config_dir: Path) -> str:
    """Where a model comes from: a Hub repo id, or a local directory (relative to the config file's folder)."""
    if not model.is_local:
        return model.repo
    local = Path(model.repo.removeprefix("file://")).expanduser()
    return str(local if local.is_absolute() else (config_dir / local).resolve())


def plan_loaded(config: PipelineConfig, config_dir: Path, catalogue: Catalogue, *, resolve_hub: bool = True) -> Plan:
    """Plan a loaded config. Local directories are always keyed by their content digest (the same digest the
    pull records); Hub revisions are resolved to commit shas only with ``resolve_hub`` (network, or the cache
    when offline), otherwise a branch is keyed by its name and the cell says its revision is not pinned."""
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
        elif resolve_hub:
            revisions[model.id] = resolve_revision(source, model.revision)
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
