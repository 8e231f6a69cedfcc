"""The support matrix of a config (``registry.support``): its cells as every kind plans them, each joined with the
registry's history of its planned inputs. ``enginesmith support`` prints it; the nightly's catalogue shows it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from enginesmith.core.checkpoints.inspect import model_shape
from enginesmith.core.config import Catalogue
from enginesmith.core.specs import PipelineConfig
from pipeline.common.plan_sources import model_source
from pipeline.common.protocol import PlannedCell
from pipeline.kind_registry import kinds_of
from registry.store import RegistryStore
from registry.support import PlannedFacts, SupportMatrix, support_matrix


def planned_facts(config: PipelineConfig, config_dir: Path, cells: Iterable[PlannedCell]) -> list[PlannedFacts]:
    """What the plan says of each cell, with its model's ``model_type`` where the checkpoint's config.json is on this
    machine (a local directory, or the Hub cache at the revision the plan keyed)."""
    cells = list(cells)
    keyed = {cell.model.id: cell.source_revision for cell in cells}
    model_types = {}
    for model in config.models:
        shape = model_shape(model_source(model, config_dir), keyed.get(model.id, model.revision))
        model_types[model.id] = shape.model_type if shape is not None else ""
    return [PlannedFacts(cell=cell.id, model=cell.model.id, model_type=model_types.get(cell.model.id, ""),
                         recipe=cell.recipe.id, kind=cell.kind, target=cell.target.id, key=cell.key,
                         buildable=cell.status == "build", rules=[v.rule for v in getattr(cell, "violations", [])],
                         reason=cell.reason)
            for cell in cells]


def support_cells(config: PipelineConfig, config_dir: Path, catalogue: Catalogue) -> list[PlannedCell]:
    """Every kind's cells of ``config``, planned without the network: a Hub branch resolved from the local Hub cache
    as an offline night resolves it (``hub_revision_notes`` says which were not)."""
    return [cell for kind in kinds_of(config) for cell in kind.plan(config, config_dir, catalogue, resolve_hub=False)]


def config_support(config: PipelineConfig, config_dir: Path, catalogue: Catalogue, store: RegistryStore, *,
                   cells: Iterable[PlannedCell] | None = None) -> SupportMatrix:
    """The matrix of ``config`` (its ``cells`` where already planned; planned here otherwise by ``support_cells``)
    from ``store``'s history."""
    from registry.history import load_history

    if cells is None:
        cells = support_cells(config, config_dir, catalogue)
    planned = planned_facts(config, config_dir, cells)
    histories = {model: load_history(store, model) for model in dict.fromkeys(cell.model for cell in planned)}
    return support_matrix(config.name, planned, histories)
