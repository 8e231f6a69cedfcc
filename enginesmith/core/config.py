"""Loading the catalogue (targets, recipes) and build-matrix configs, with every cross-reference checked."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from enginesmith.core.errors import ConfigError, UserError
from enginesmith.core.specs import (
    EncoderRecipeSpec,
    PipelineConfig,
    RecipeCatalogue,
    RecipeSpec,
    TargetCatalogue,
    TargetSpec,
)
from enginesmith.core.tasks import resolve_task
from enginesmith.core.tuning import KNOBS_FILE, ServingKnobs
from enginesmith.core.yamlio import YamlDocument, format_loc

CATALOGUE_ENV = "ENGINESMITH_CONFIG_DIR"
CATALOGUE_FILES = ("targets.yaml", "recipes.yaml", "runtimes/runtimes.yaml")


def shipped_catalogue_dir() -> Path:
    """The catalogue the package ships (package data, whatever is installed where)."""
    return Path(str(resources.files("enginesmith") / "catalogue"))


def config_dir() -> Path:
    """Where the catalogue (``targets.yaml``, ``recipes.yaml``, ``runtimes/``) is read from: ``$ENGINESMITH_CONFIG_DIR``
    (an operator's own), else the one the package ships. A directory the setting names must hold every file."""
    configured = os.environ.get(CATALOGUE_ENV)
    if not configured:
        return shipped_catalogue_dir()
    directory = Path(configured).expanduser()
    missing = [name for name in CATALOGUE_FILES if not (directory / name).is_file()]
    if missing:
        raise ConfigError(f"the catalogue directory {CATALOGUE_ENV} names lacks {', '.join(missing)}",
                          path=directory / missing[0], field=CATALOGUE_ENV,
                          hint=f"copy the shipped catalogue ({shipped_catalogue_dir()}) there and edit it, or unset "
                               f"{CATALOGUE_ENV} to use it as shipped")
    return directory


@dataclass(frozen=True)
class Catalogue:
    """The known GPU targets and quantisation recipes, by id."""

    targets: dict[str, TargetSpec]
    recipes: dict[str, RecipeSpec]
    encoder_recipes: dict[str, EncoderRecipeSpec] = field(default_factory=dict)
    serving_knobs: ServingKnobs = field(default_factory=lambda: ServingKnobs(runtimes={}))

    def target(self, target_id: str) -> TargetSpec:
        try:
            return self.targets[target_id]
        except KeyError:
            raise ConfigError(
                f"unknown target {target_id!r}", field="target", hint=f"known targets: {', '.join(self.targets)}"
            ) from None

    def recipe(self, recipe_id: str) -> RecipeSpec:
        try:
            return self.recipes[recipe_id]
        except KeyError:
            raise ConfigError(
                f"unknown recipe {recipe_id!r}", field="recipe", hint=f"known recipes: {', '.join(self.recipes)}"
            ) from None


def load_catalogue(directory: Path | None = None) -> Catalogue:
    directory = directory or config_dir()
    targets = YamlDocument.read(directory / "targets.yaml").validate(TargetCatalogue).targets
    recipe_catalogue = YamlDocument.read(directory / "recipes.yaml").validate(RecipeCatalogue)
    # An operator's catalogue from before the serving knobs existed keeps working with the shipped ones.
    knobs_file = directory / KNOBS_FILE if (directory / KNOBS_FILE).is_file() else shipped_catalogue_dir() / KNOBS_FILE
    knobs = YamlDocument.read(knobs_file).validate(ServingKnobs)
    return Catalogue(targets={t.id: t for t in targets}, recipes={r.id: r for r in recipe_catalogue.recipes},
                     encoder_recipes={r.id: r for r in recipe_catalogue.encoder_recipes}, serving_knobs=knobs)


@cache
def default_catalogue() -> Catalogue:
    return load_catalogue()


def load_pipeline_config(path: Path | str, catalogue: Catalogue | None = None, *,
                         check_tasks: bool = True) -> PipelineConfig:
    """Read and validate a build-matrix config; every unknown name is an error naming the known ones.
    ``check_tasks=False`` leaves unknown accuracy tasks to the caller (preflight reports them per cell)."""
    document = YamlDocument.read(path)
    config = document.validate(PipelineConfig)
    catalogue = catalogue or default_catalogue()
    errors = _reference_errors(config, catalogue) + (task_errors(config) if check_tasks else [])
    for loc, message, hint in errors:
        raise ConfigError(message, path=document.path, line=document.line_of(loc), field=format_loc(loc), hint=hint)
    return config


def _reference_errors(
    config: PipelineConfig, catalogue: Catalogue
) -> list[tuple[tuple[str | int, ...], str, str]]:
    errors: list[tuple[tuple[str | int, ...], str, str]] = []
    model_ids = [m.id for m in config.models]
    lists: list[tuple[str, list[str]]] = [
        ("models", model_ids),
        ("recipes", list(catalogue.recipes)),
        ("targets", list(catalogue.targets)),
    ]
    for block_index, block in enumerate(config.matrix):
        for field_name, known in lists:
            for item_index, name in enumerate(getattr(block, field_name)):
                if name not in known:
                    singular = field_name.removesuffix("s")
                    errors.append(
                        (("matrix", block_index, field_name, item_index), f"unknown {singular} {name!r}",
                         f"known {field_name}: {', '.join(known)}")
                    )
        if block.profile != "default" and block.profile not in config.profiles:
            errors.append(
                (("matrix", block_index, "profile"), f"unknown build profile {block.profile!r}",
                 f"define it under 'profiles:' (known: default{''.join(', ' + p for p in config.profiles)})")
            )
    encoder_lists: list[tuple[str, list[str]]] = [
        ("models", [e.id for e in config.encoders]),
        ("recipes", list(catalogue.encoder_recipes)),
        ("targets", list(catalogue.targets)),
    ]
    for block_index, encoder_block in enumerate(config.encoder_matrix):
        for field_name, known in encoder_lists:
            for item_index, name in enumerate(getattr(encoder_block, field_name)):
                if name not in known:
                    what = "encoder" if field_name == "models" else f"encoder {field_name.removesuffix('s')}"
                    errors.append(
                        (("encoder_matrix", block_index, field_name, item_index), f"unknown {what} {name!r}",
                         f"known: {', '.join(known) or 'none (list encoders under encoders:)'}")
                    )
    for recipe_id in config.encoder_gates.min_cosine:
        if recipe_id not in catalogue.encoder_recipes:
            errors.append(
                (("encoder_gates", "min_cosine", recipe_id), f"unknown encoder recipe {recipe_id!r}",
                 f"known encoder recipes: {', '.join(catalogue.encoder_recipes)}")
            )
    for recipe_id in config.gates.max_accuracy_drop_points:
        if recipe_id not in catalogue.recipes:
            errors.append(
                (("gates", "max_accuracy_drop_points", recipe_id), f"unknown recipe {recipe_id!r}",
                 f"known recipes: {', '.join(catalogue.recipes)}")
            )
    return errors


def task_errors(config: PipelineConfig) -> list[tuple[tuple[str | int, ...], str, str]]:
    """Accuracy tasks that validation does not know how to ask and score: every cell would fail after quantise and
    build."""
    errors: list[tuple[tuple[str | int, ...], str, str]] = []
    for task_index, task in enumerate(config.workload.accuracy_tasks):
        try:
            resolve_task(task)
        except UserError as exc:  # an unknown name, or a local task file that is missing or not a task
            where = f" ({exc.where})" if exc.where and not isinstance(exc, ConfigError) else ""
            errors.append((("workload", "accuracy_tasks", task_index), exc.message + where,
                           f"{exc.hint or 'fix the task file'} (every cell would fail in validation, after quantise "
                           "and build)"))
    return errors
