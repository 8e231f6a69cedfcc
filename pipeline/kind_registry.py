"""The registered cell kinds: the built-in ones (LLMs, encoders), registered here, and those plug-ins register when
their modules are imported (``enginesmith.core.plugins``: the config's ``plugins``, or ``ENGINESMITH_PLUGINS``).
Planning, the preflight, the nightly, deploy and the CLI reach the kinds through here and never name one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from enginesmith.core.config import Catalogue
from enginesmith.core.errors import ConfigError
from enginesmith.core.plugins import load_env_plugins, load_plugins
from enginesmith.core.specs import PipelineConfig
from pipeline.common.protocol import CellKind, PlannedCell

KINDS: dict[str, CellKind] = {}
# A kind's own typed form (the parameters of a flow of its own, which the Prefect UI renders) and how that kind plans
# the one cell a filled-in form asks for: the config's path, the config as the form amends it, the planned cell.
FormPlanner = Callable[[Any], tuple[Path, PipelineConfig, PlannedCell]]
FORMS: dict[type[BaseModel], tuple[CellKind, FormPlanner]] = {}


def register_kind(kind: CellKind) -> None:
    KINDS[kind.name] = kind


def register_form(form: type[BaseModel], kind: CellKind, planner: FormPlanner) -> None:
    FORMS[form] = (kind, planner)


def planned_from_form(form: BaseModel) -> tuple[CellKind, Path, PipelineConfig, PlannedCell]:
    """The kind whose form ``form`` is, and the cell it asks for, planned by that kind (a plug-in named in
    ``ENGINESMITH_PLUGINS`` may register the form's planner)."""
    load_env_plugins()
    kind, planner = FORMS[type(form)]
    config_path, config, cell = planner(form)
    return kind, config_path, config, cell


def kinds_of(config: PipelineConfig) -> list[CellKind]:
    """The kinds whose cells the config plans, in registration order (LLMs, encoders, then plug-ins)."""
    load_env_plugins()
    load_plugins(config.plugins)
    unknown = sorted(set(config.kinds) - set(KINDS))
    if unknown:
        raise ConfigError(f"kinds section names {', '.join(unknown)}, which no registered kind is",
                          field=f"kinds.{unknown[0]}",
                          hint=f"kinds registered: {', '.join(KINDS)}; a plug-in kind's module goes under plugins")
    return [kind for kind in KINDS.values() if kind.in_config(config)]


def find_planned(config: PipelineConfig, config_dir: Path, catalogue: Catalogue,
                 cell_id: str) -> tuple[CellKind, PlannedCell]:
    """The kind and the planned cell of ``cell_id``, among every kind the config plans."""
    ids: list[str] = []
    for kind in kinds_of(config):
        for cell in kind.plan(config, config_dir, catalogue):
            if cell.id == cell_id:
                return kind, cell
            ids.append(cell.id)
    raise ConfigError(f"no cell {cell_id!r} in the config", field="cell",
                      hint="cells: " + (", ".join(ids[:20]) or "none"))


def _register_builtin() -> None:
    from pipeline.common.params import BuildCellParams
    from pipeline.kinds.encoder import ENCODER
    from pipeline.kinds.llm import LLM, cell_for

    register_kind(LLM)
    register_kind(ENCODER)
    register_form(BuildCellParams, LLM, cell_for)


_register_builtin()
