"""Expanding the encoder matrix into cells, each with its validity and its stage keys. Pure: the caller passes in
what each encoder's source resolved to.

An encoder cell is model × encoder recipe × target × kind. Its stages: export (the checkpoint to an ONNX graph at
the recipe's opset), quantise (ModelOpt ONNX quantisation, or the precision cast, or nothing), build (the artefact
directory for onnxruntime, or a TensorRT engine from trtexec), validate (against vLLM's embeddings of the
checkpoint). Each stage's key names everything that decides its output; the validation key is the registry key.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import product
from typing import Literal

from pydantic import BaseModel

from enginesmith.core.checkpoints.models import LOCAL_SOURCE, checkpoint_key
from enginesmith.core.compat import Violation, describe_violations
from enginesmith.core.config import Catalogue
from enginesmith.core.errors import ConfigError
from enginesmith.core.keys import stage_key
from enginesmith.core.specs import (
    EncoderKind,
    EncoderModelSpec,
    EncoderRecipeSpec,
    PipelineConfig,
    TargetSpec,
    is_commit_sha,
)


class EncoderStageKeys(BaseModel):
    checkpoint: str
    export: str
    quantize: str
    build: str
    validation: str


class EncoderCell(BaseModel):
    """One encoder × recipe × target × kind, as planned."""

    id: str
    model: EncoderModelSpec
    source_revision: str
    revision_pinned: bool
    recipe: EncoderRecipeSpec
    target: TargetSpec
    kind: EncoderKind
    status: Literal["build", "invalid"]
    violations: list[Violation]
    stage_keys: EncoderStageKeys

    @property
    def key(self) -> str:
        return self.stage_keys.validation

    @property
    def reason(self) -> str:
        return describe_violations(self.violations)

    def listing(self) -> dict[str, object]:
        return {"id": self.id, "model": self.model.id, "repo": self.model.repo, "revision": self.source_revision,
                "recipe": self.recipe.id, "target": self.target.id, "kind": self.kind, "status": self.status,
                "key": self.key, "keys": self.stage_keys.model_dump(),
                "reasons": [v.model_dump() for v in self.violations]}


def encoder_cell_id(model_id: str, recipe_id: str, target_id: str, kind: str) -> str:
    return f"{model_id}/{recipe_id}/{target_id}/{kind}"


def encoder_violations(recipe: EncoderRecipeSpec, target: TargetSpec, kind: EncoderKind) -> list[Violation]:
    """Why an encoder cell cannot be built (empty: it can)."""
    found: list[Violation] = []
    if kind == "onnx" and not target.is_cpu:
        found.append(Violation(rule="onnx-on-cpu", message=(
            f"the onnx kind runs on onnxruntime's CPU provider, so its target is cpu, not {target.id}; "
            f"a GPU SKU gets a tensorrt-engine")))
    if kind == "onnx" and target.is_cpu and not recipe.cpu.supported:
        found.append(Violation(rule="recipe-cpu", message=f"{recipe.id} on the cpu: {recipe.cpu.why}"))
    if kind == "tensorrt-engine" and target.is_cpu:
        found.append(Violation(rule="engine-needs-gpu", message="a TensorRT engine is built and run on a GPU of the "
                                                                 "SKU; the cpu target gets the onnx kind"))
    if kind == "tensorrt-engine" and target.sm is not None and target.sm not in recipe.tensorrt_sm:
        found.append(Violation(rule="recipe-sm", message=f"{recipe.id} on {target.id} (SM {target.sm_label}): "
                                                         f"{recipe.tensorrt_why}"))
    if kind == "tensorrt-engine":
        # builders/tensorrt_encoder.py builds one, but nothing here runs it behind /v1/embeddings to validate it:
        # planned, such a cell would fail every night after export and quantise, and never publish.
        found.append(Violation(rule="engine-not-validated", message=(
            "a TensorRT engine encoder cannot be validated by this pipeline yet (it needs a TensorRT runner on a GPU "
            "of the SKU); build the onnx kind, or the engine alone with builders.tensorrt_encoder")))
    return found


def layout_violations(model: EncoderModelSpec, layout: Mapping[str, object] | None) -> list[Violation]:
    """Where the config's ``pooling``/``normalize`` contradict what the checkpoint's own modules say (they assert
    the checkpoint, they never override it): such a cell would be refused when it is exported."""
    if layout is None:
        return []
    return [Violation(rule="encoder-layout", message=(
        f"encoders.{model.id}.{field} is {expected!r}, but the checkpoint's modules say {layout[field]!r}: remove "
        f"{field} from the config, or point it at a checkpoint that is {expected}"))
        for field, expected in (("pooling", model.pooling), ("normalize", model.normalize))
        if expected is not None and layout.get(field) != expected]


def encoder_stage_keys(config: PipelineConfig, model: EncoderModelSpec, revision: str, recipe: EncoderRecipeSpec,
                       target: TargetSpec, kind: EncoderKind, calibration_fingerprint: str,
                       layout: Mapping[str, object] | None = None) -> EncoderStageKeys:
    """``layout``: the checkpoint's pooling, normalisation and sequence length as its modules say (the checkpoint
    digest covers those files too; the layout in the export key says what the graph was made with)."""
    tools = config.toolchains
    source = LOCAL_SOURCE if model.is_local else model.repo
    checkpoint = checkpoint_key(source, revision)
    export = stage_key("encoder-export", {
        # the checkpoint's own layout decides the graph; the config's pooling/normalize only assert it
        "checkpoint": checkpoint, "layout": dict(layout or {}), "opset": recipe.opset, "torch": tools.quantize.torch,
        "transformers": tools.quantize.transformers, "onnx": tools.encoder.onnx})
    quantize = stage_key("encoder-quantize", {
        # max_length: the served length, and the calibration sequences are cut to it
        "export": export, "quantize": recipe.quantize, "precision": recipe.precision, "max_length": model.max_length,
        # an unquantised recipe has no calibration and no quantiser: its key must not move with them
        "calibration": calibration_fingerprint if recipe.quantize else None,
        "modelopt": tools.quantize.modelopt if recipe.quantize else None})
    build = stage_key("encoder-build", {
        "quantize": quantize, "kind": kind, "target": target.id, "sm": target.sm,
        "builder": tools.encoder.tensorrt if kind == "tensorrt-engine" else tools.encoder.onnxruntime})
    validation = stage_key("encoder-validate", {
        "build": build, "reference": checkpoint, "vllm": tools.vllm.vllm, "workload": config.encoder_workload,
        "min_cosine": config.encoder_gates.min_cosine_for(recipe.id),
        "max_recall_drop": config.encoder_gates.max_recall_drop,
        "min_throughput_ratio": config.encoder_gates.min_throughput_ratio})
    return EncoderStageKeys(checkpoint=checkpoint, export=export, quantize=quantize, build=build,
                            validation=validation)


def plan_encoders(config: PipelineConfig, catalogue: Catalogue, *, calibration_fingerprint: str,
                  source_revisions: Mapping[str, str] | None = None,
                  layouts: Mapping[str, Mapping[str, object]] | None = None) -> list[EncoderCell]:
    """Every encoder matrix block expanded into cells; a cell listed by two blocks is an error. ``layouts``: each
    encoder's pooling layout as its checkpoint's modules say, where the caller could read it."""
    source_revisions = source_revisions or {}
    layouts = layouts or {}
    cells: list[EncoderCell] = []
    origin: dict[str, int] = {}
    for block_index, block in enumerate(config.encoder_matrix):
        for model_id, recipe_id, target_id, kind in product(block.models, block.recipes, block.targets, block.kinds):
            this_id = encoder_cell_id(model_id, recipe_id, target_id, kind)
            if this_id in origin:
                raise ConfigError(f"cell {this_id} is listed twice (encoder_matrix[{origin[this_id]}] and "
                                  f"encoder_matrix[{block_index}])", field=f"encoder_matrix[{block_index}]",
                                  hint="remove it from one of the blocks")
            origin[this_id] = block_index
            model = config.encoder(model_id)
            revision = source_revisions.get(model_id, model.revision)
            recipe, target = catalogue.encoder_recipes[recipe_id], catalogue.targets[target_id]
            found = encoder_violations(recipe, target, kind) + layout_violations(model, layouts.get(model_id))
            cells.append(EncoderCell(
                id=this_id, model=model, source_revision=revision,
                revision_pinned=is_commit_sha(revision) or revision.startswith("sha256:"), recipe=recipe,
                target=target, kind=kind, status="invalid" if found else "build", violations=found,
                stage_keys=encoder_stage_keys(config, model, revision, recipe, target, kind,
                                              calibration_fingerprint, layouts.get(model_id))))
    return cells
