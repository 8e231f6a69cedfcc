"""The cell-kind protocol: each family of models the pipeline builds (LLMs, encoders, and whatever a plug-in adds)
as one implementation of ``CellKind``. Planning, the preflight, the nightly, history, the catalogue and the CLI
iterate over the kinds a config uses (``pipeline.kind_registry``) and never branch on one.

A kind plans its cells from its own section of the config, judges them before anything is dispatched, says which
work pool builds each, and names the flow (and its parameters) that builds one; its report model is registered in
the vocabulary (``enginesmith.core.reports.register_report``) so every reader of a manifest can read it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict

from enginesmith.core.config import Catalogue
from enginesmith.core.errors import ConfigError, UserError
from enginesmith.core.specs import PipelineConfig, TargetSpec
from pipeline.common.verdicts import CellPreflight


class PlannedModel(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def repo(self) -> str: ...

    @property
    def is_local(self) -> bool: ...


class PlannedRecipe(Protocol):
    @property
    def id(self) -> str: ...


class PlannedCell(Protocol):
    """What every kind's planned cell carries."""

    @property
    def id(self) -> str: ...

    @property
    def kind(self) -> str: ...  # the artefact kind it builds

    @property
    def key(self) -> str: ...  # the registry key (its validation key)

    @property
    def status(self) -> str: ...  # "build" or "invalid"

    @property
    def reason(self) -> str: ...  # why it is invalid

    @property
    def model(self) -> PlannedModel: ...

    @property
    def recipe(self) -> PlannedRecipe: ...

    @property
    def target(self) -> TargetSpec: ...

    @property
    def source_revision(self) -> str: ...

    def listing(self) -> dict[str, object]: ...


class Dispatch(BaseModel):
    """How the nightly starts one cell's build: the flow (its deployments are ``<flow>/<pool>``) and its
    parameters."""

    flow: str
    parameters: dict[str, Any]


# Which planned cells a preflight judges (the nightly: those it will dispatch); None judges every cell.
CellFilter = Callable[["PlannedCell"], bool]


class KindPreflight(BaseModel):
    """A kind's cells, each judged (those its filter selected), and the checks skipped for all of them (with why)."""

    verdicts: list[CellPreflight]
    skipped: list[str] = []
    vllm_parser: str | None = None


T = TypeVar("T")


class StageRunner(Protocol):
    """How a kind's ``run`` calls each of its stages. The flows wrap each call in a Prefect task (cached under
    ``key`` while ``done`` exists, retried ``retries`` times on a transient error); ``PlainStages`` calls it."""

    def __call__(self, name: str, fn: Callable[..., T], *args: Any, key: str | None = None,
                 done: Path | None = None, retries: int = 0) -> T: ...

    def elsewhere(self, pool: str, until: str) -> None:
        """Run this same cell on ``pool``'s nodes up to the stage ``until`` and wait for it (a stage that needs
        a bigger node than the rest of the cell, handing its output over through the registry)."""
        ...


class PlainStages:
    """Each stage called in this process, in order; no caching beyond what each stage keeps on disk."""

    def __call__(self, name: str, fn: Callable[..., T], *args: Any, key: str | None = None,
                 done: Path | None = None, retries: int = 0) -> T:
        return fn(*args)

    def elsewhere(self, pool: str, until: str) -> None:
        raise UserError(f"this cell runs its stages up to {until} on pool {pool!r}, which only a deployment run can "
                        "hand over", where=f"pool {pool}", hint="run it from the nightly or its build deployment")


class CellContext(BaseModel):
    """What a cell's run works with: the config (and where it was read, for local model paths), the work
    directory, and where to stop (``until``: a stage name; None: validate, for the flow to publish)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    config_path: Path
    config: PipelineConfig
    work: Path
    until: str | None = None
    pool: str | None = None  # the pool of the deployment running it; None in-process


class CellRun(BaseModel):
    """What a kind's run ends with: the artefact and its validation report (JSON, as the manifest keeps it), or
    ``stopped`` with why where it stopped early (``until``)."""

    artefact_dir: Path | None = None
    report: dict[str, Any] | None = None
    stopped: str = ""


class CellKind(Protocol):
    name: str  # its section of the config and its entry in ``enginesmith plan --json``

    def in_config(self, config: PipelineConfig) -> bool:
        """Does the config plan any cell of this kind?"""
        ...

    def plan(self, config: PipelineConfig, config_dir: Path, catalogue: Catalogue, *,
             resolve_hub: bool = True) -> list[PlannedCell]: ...

    def preflight(self, config: PipelineConfig, config_dir: Path, catalogue: Catalogue, *,
                  parse_with_vllm: bool = True, select: CellFilter | None = None
                  ) -> tuple[list[PlannedCell], KindPreflight]:
        """Plan with everything resolved (the Hub, the checkpoints' own files) and judge every cell ``select``
        takes (all where None): the slow checks (vLLM's parser, the Hub's datasets) are made for those alone."""
        ...

    def pool(self, cell: PlannedCell) -> str:
        """The work pool of nodes that can build the cell."""
        ...

    def pools(self, targets: Iterable[TargetSpec]) -> set[str]:
        """Every pool a cell of this kind for one of ``targets`` may need (the deployments a fleet creates)."""
        ...

    def run(self, cell: PlannedCell, context: CellContext, stage: StageRunner) -> CellRun:
        """The cell's stages in order, each through ``stage``: the artefact and its report, or where it stopped."""
        ...

    def dispatch(self, config_path: str, cell: PlannedCell) -> Dispatch: ...

    def handover(self, config_path: str, cell: PlannedCell) -> tuple[str, Dispatch] | None:
        """A run on another pool that the cell's own run needs first, as its pool and dispatch (an LLM cell's pull
        and quantise where ``quantize_on`` names another SKU: the fleet dispatcher runs it first, on a node of
        that pool); None where the cell's run does all its stages itself."""
        ...

    def table_row(self, cell: PlannedCell) -> tuple[str, str]:
        """The cell in ``enginesmith plan``'s table: its parallelism (or "-"), and a note on how it was planned."""
        ...


def kind_section(config: PipelineConfig, name: str, model: type[BaseModel]) -> BaseModel | None:
    """A plug-in kind's own section of the config (``kinds.<name>``), validated by its model; None when absent."""
    section: Mapping[str, Any] | None = config.kinds.get(name)
    if section is None:
        return None
    from pydantic import ValidationError

    try:
        return model.model_validate(section)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ConfigError(f"kinds.{name}.{where}: {first['msg']}", field=f"kinds.{name}.{where}") from None
