"""Which cells can be built: one table of rules, each with its reason, checked at plan time.

A cell that breaks a rule is planned as ``invalid`` with the rule's id and a message, so no GPU time is
spent finding out. The SM rules follow trtllm-build's own guards (TensorRT-LLM 1.2.x) and its support
matrix; where the docs and the builder disagree, the builder wins. Per-recipe SM lists live in
the catalogue's ``recipes.yaml`` (data that grows with new GPUs); the rules that read them live here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

from pydantic import BaseModel

from enginesmith.core.families import no_trtllm_export, unknown_family
from enginesmith.core.memory import SERVED_REFERENCE_BYTES, cell_needs
from enginesmith.core.shapes import BlockSizeChoice, ModelShape, choose_awq_block_size
from enginesmith.core.specs import ArtefactKind, ModelSpec, RecipeSpec, TargetSpec, Toolchains

# TensorRT-LLM release → the ModelOpt minor version its wheel pins (nvidia-modelopt[torch]~=X.Y.0). A
# TensorRT-LLM checkpoint exported by another ModelOpt is refused here rather than by trtllm-build.
TRTLLM_MODELOPT_PINS: dict[str, str] = {"1.2.0": "0.37", "1.2.1": "0.37"}
# The TensorRT engine backend was frozen after 1.2 and removed after 1.3.0rc20.
LAST_ENGINE_BACKEND_MINOR = (1, 2)


class CellRequest(BaseModel):
    """Everything the rules look at for one cell."""

    model: ModelSpec
    recipe: RecipeSpec
    target: TargetSpec
    kind: ArtefactKind
    tp: int
    pp: int
    toolchains: Toolchains
    shape: ModelShape | None = None  # from the model's config.json, when the planner could read it
    quantize_target: TargetSpec | None = None  # the SKU that quantises it, where not its own

    @cached_property
    def awq_block(self) -> BlockSizeChoice | None:
        """The AWQ block size this cell would quantise with (None for recipes without AWQ blocks)."""
        return choose_awq_block_size(self.recipe, self.shape, tp=self.tp)


class Violation(BaseModel):
    rule: str
    message: str


@dataclass(frozen=True)
class Rule:
    id: str
    reason: str
    check: Callable[[CellRequest], str | None]


def _engine_needs_gpu(cell: CellRequest) -> str | None:
    if cell.target.is_cpu and cell.kind == "trtllm-engine":
        return "the cpu target has no TensorRT-LLM engines; use kind hf-quantized"
    return None


def _recipe_on_cpu(cell: CellRequest) -> str | None:
    if cell.target.is_cpu and not cell.recipe.cpu.supported:
        return f"{cell.recipe.id} on cpu: {cell.recipe.cpu.why}"
    return None


def _recipe_on_sm(cell: CellRequest) -> str | None:
    if cell.target.is_cpu:
        return None
    support = cell.recipe.support.get(cell.kind)
    if support is None:
        return f"recipe {cell.recipe.id} has no {cell.kind} support"
    if cell.target.sm not in support.sm:
        return f"{cell.recipe.id} {cell.kind} on {cell.target.id} (SM {cell.target.sm_label}): {support.why}"
    return None


def _parallel_fits_node(cell: CellRequest) -> str | None:
    world = cell.tp * cell.pp
    if world > cell.target.gpus_per_node:
        return (
            f"tp×pp = {world} GPUs but a {cell.target.id} node has {cell.target.gpus_per_node}"
            + ("" if not cell.target.is_cpu else " (the cpu target runs tp=1, pp=1)")
        )
    return None


def _fits_memory(cell: CellRequest) -> str | None:
    if cell.model.params_b is None:
        return None
    # The plan assumes a BF16 checkpoint; preflight reads the real dtype.
    needs = cell_needs(cell.model.params_b * 1e9, SERVED_REFERENCE_BYTES, cell.recipe, cell.target, tp=cell.tp,
                       pp=cell.pp, quantize_target=cell.quantize_target)
    short = [need.describe() for need in needs if not need.fits]
    if not short:
        return None
    return f"{cell.model.id} with {cell.recipe.id} at tp×pp={cell.tp * cell.pp} on {cell.target.id}: {'; '.join(short)}"


def _engine_backend_version(cell: CellRequest) -> str | None:
    if cell.kind != "trtllm-engine":
        return None
    version = cell.toolchains.trtllm.tensorrt_llm
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return f"tensorrt_llm version {version!r} is not a release number"
    if major_minor > LAST_ENGINE_BACKEND_MINOR:
        return f"TensorRT-LLM {version} has no TensorRT engine backend (frozen at 1.2.x); pin tensorrt_llm 1.2.1"
    return None


def modelopt_pin_problem(tensorrt_llm: str, exporter: str) -> str | None:
    """Why a TensorRT-LLM checkpoint exported by ModelOpt ``exporter`` (a config's pin, or the version a quantised
    checkpoint records) should not reach trtllm-build from TensorRT-LLM ``tensorrt_llm``; None when it may."""
    pinned = TRTLLM_MODELOPT_PINS.get(tensorrt_llm)
    if pinned is None:
        return f"no known ModelOpt pin for TensorRT-LLM {tensorrt_llm} (known: {', '.join(TRTLLM_MODELOPT_PINS)})"
    if ".".join(exporter.split(".")[:2]) == pinned:
        return None
    return (f"exported by ModelOpt {exporter}; TensorRT-LLM {tensorrt_llm} reads the exports of the ModelOpt it "
            f"pins (~={pinned}.0)")


def _engine_modelopt_pin(cell: CellRequest) -> str | None:
    if cell.kind != "trtllm-engine" or cell.recipe.is_passthrough:
        return None
    return modelopt_pin_problem(cell.toolchains.trtllm.tensorrt_llm, cell.toolchains.trtllm.modelopt)


def _awq_block_fits(cell: CellRequest) -> str | None:
    choice = cell.awq_block
    if choice is None or choice.size is not None:
        return None
    return f"{cell.recipe.id} on {cell.model.id}: {choice.reason}"


def _known_family(cell: CellRequest) -> str | None:
    return unknown_family(cell.shape.model_type) if cell.shape is not None else None


def _trtllm_export_family(cell: CellRequest) -> str | None:
    if cell.kind != "trtllm-engine" or cell.shape is None:
        return None
    return no_trtllm_export(cell.shape.model_type)


def _weights_not_already_quantized(cell: CellRequest) -> str | None:
    prior = cell.shape.prior_quantization if cell.shape else None
    if prior is None or cell.recipe.is_passthrough or cell.recipe.weight_bits > prior.weight_bits:
        return None
    recipe = cell.recipe.id
    return (f"{recipe} on {cell.model.id}: its weights are already {prior.weight_bits}-bit values "
            f"({prior.description}); {recipe} would round them again onto its own {cell.recipe.weight_bits}-bit "
            f"grid. Quantise an unquantised original of the model, or drop {recipe} for it")


RULES: tuple[Rule, ...] = (
    Rule("model-family", "a checkpoint's model_type must be a family the stages have been run on "
         "(enginesmith.core.families): an unknown one is refused before any model is loaded.", _known_family),
    Rule("trtllm-export-family", "the TensorRT-LLM checkpoint export takes a decoder type per family; a family it "
         "has none for would fail at export, after loading and calibration.", _trtllm_export_family),
    Rule("engine-needs-gpu", "trtllm-build times kernels on the GPU it builds for; there is no CPU engine.",
         _engine_needs_gpu),
    Rule("recipe-on-cpu", "a cpu artefact serves the quantised weights folded into BF16, which needs the "
         "fake-quant forward to run on a CPU.", _recipe_on_cpu),
    Rule("recipe-on-sm", "each quantisation format has kernels only for some SMs; trtllm-build refuses the "
         "rest (FP8 needs SM ≥ 8.9, INT4/INT8 are refused on SM 10.0–11.9, NVFP4 needs Blackwell, W4A8 "
         "AWQ SM 8.9–9.0).", _recipe_on_sm),
    Rule("parallel-fits-node", "an engine runs on exactly tp×pp GPUs of one node.", _parallel_fits_node),
    Rule("fits-memory", "each stage must fit the SKU's memory: quantising on one of its nodes, serving the candidate "
         "on tp×pp GPUs, and the BF16 reference it is validated against on as many of one node's GPUs as its weights "
         "need (weights plus runtime overhead).",
         _fits_memory),
    Rule("engine-backend-version", "TensorRT-LLM's engine backend exists only up to 1.2.x.",
         _engine_backend_version),
    Rule("awq-block-fits", "INT4 AWQ packs each weight row in blocks along its input width; ModelOpt's export "
         "and TensorRT-LLM's groupwise kernels refuse a partial block, so every quantised linear's input width "
         "must divide by the block size (read from config.json at plan time).", _awq_block_fits),
    Rule("weights-already-quantized", "weights that were already rounded to N bits (a GGUF dequantised to BF16, "
         "a checkpoint saved quantised) stack a second rounding error when quantised again to N bits or fewer, "
         "and what is validated is then a copy of a copy. Measured on SmolLM2-135M's Q4_1 copy: int4-awq at "
         "block 64 lost 26.3 points on facts and gained 24.8 % perplexity, against 3.2 points and 1.2 % for fp8; "
         "aligning the blocks with the source's 32 (which TensorRT-LLM's W4A16 kernels do not take) recovered "
         "little (held-out perplexity +12.2 % against +15.2 % at block 64).", _weights_not_already_quantized),
    Rule("engine-modelopt-pin", "TensorRT-LLM reads checkpoints written by the ModelOpt it pins; a newer "
         "exporter's layout is not guaranteed to load.", _engine_modelopt_pin),
)


def describe_violations(found: list[Violation]) -> str:
    """The rules a cell breaks, as one line: ``[rule] message; …``."""
    return "; ".join(f"[{v.rule}] {v.message}" for v in found)


def violations(cell: CellRequest) -> list[Violation]:
    """Every rule the cell breaks, in table order (empty: the cell can be built)."""
    found = []
    for rule in RULES:
        message = rule.check(cell)
        if message is not None:
            found.append(Violation(rule=rule.id, message=message))
    return found
