"""What the encoder path's stages share, as vocabulary: the quantise stage's graph (``EncoderGraph``) and the
records it carries (the ONNX export, the ONNX quantisation, the agreement with FP32), the artefact's serve config
(``embedding_config.json``), the encoder toolchain check, and the per-sentence cosine the quality checks and the
validation both measure.

Metric: ``cosine_i = a_i · b_i / (‖a_i‖ ‖b_i‖)`` per row ``i``; a report carries its minimum and mean.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from enginesmith.core.checkpoints.encoder_layout import EncoderLayout
from enginesmith.core.checkpoints.models import Checkpoint
from enginesmith.core.errors import UserError

if TYPE_CHECKING:
    import numpy as np

GRAPH_FILE = "model.onnx"
STAGE_RECORD = "encoder.json"
SERVE_CONFIG_FILE = "embedding_config.json"
OnnxQuantMode = Literal["int8", "fp8"]


class EmbeddingAgreement(BaseModel):
    """Per-sentence cosine similarity of ``candidate`` against ``reference`` embeddings."""

    model_config = ConfigDict(frozen=True)

    reference: str
    candidate: str
    sentences: int
    min_cosine: float
    mean_cosine: float
    worst_sentence: str


class OnnxExportResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    onnx_path: Path
    opset: int
    input_names: list[str]
    output_name: str
    hidden_size: int
    layout: EncoderLayout
    exporter: str
    export_seconds: float


class OnnxQuantizeResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    output_path: Path
    mode: OnnxQuantMode
    calibration_method: str
    input_opset: int
    output_opset: int
    calibration_sentences: int
    sequence_length: int
    quantize_linear_nodes: int
    dequantize_linear_nodes: int
    quantized_op_types: dict[str, int]  # op type -> how many of its nodes take a DequantizeLinear output
    quantize_seconds: float


class EmbeddingServeConfig(BaseModel):
    """How to run an embedding artefact's graph: ``embedding_config.json`` beside ``model.onnx``.

    ``pooling`` is ``in_graph`` when the graph returns pooled (and, with ``normalize``, normalised) vectors as
    ``output_name``; ``mean`` or ``cls`` when it returns token states that this server pools."""

    model_config = ConfigDict(extra="forbid")

    max_seq_length: int = Field(gt=1)
    pooling: Literal["in_graph", "mean", "cls"] = "in_graph"
    normalize: bool = True
    output_name: str = "sentence_embedding"

    def write(self, artefact_dir: Path) -> Path:
        path = artefact_dir / SERVE_CONFIG_FILE
        path.write_text(self.model_dump_json(indent=2) + "\n")
        return path

    @classmethod
    def read(cls, artefact_dir: Path) -> EmbeddingServeConfig:
        path = artefact_dir / SERVE_CONFIG_FILE
        if not path.is_file():
            raise UserError(f"no {SERVE_CONFIG_FILE} in the artefact", where=str(artefact_dir),
                            hint="the embedding builder writes it; for a hand-made artefact write "
                                 '{"max_seq_length": 256, "pooling": "in_graph"} (the model\'s '
                                 "sentence_bert_config.json gives max_seq_length)")
        try:
            return cls.model_validate_json(path.read_text())
        except ValidationError as exc:
            raise UserError(f"invalid {SERVE_CONFIG_FILE}: {exc}", where=str(path),
                            hint="fields: max_seq_length, pooling (in_graph|mean|cls), normalize, output_name") \
                from None


class EncoderGraph(BaseModel):
    """The quantise stage's output: the recipe's graph and what made it."""

    key: str  # the quantize stage key
    recipe: str
    checkpoint: Checkpoint
    out_dir: str
    export_path: str  # the FP32 export (the unquantised baseline validation also serves)
    opset: int
    layout: EncoderLayout
    max_seq_length: int
    quantization: OnnxQuantizeResult | None = None
    precision: str
    agreement: EmbeddingAgreement | None = None  # this graph vs the FP32 export, held-out sentences
    calibration_sha256: str | None = None
    versions: dict[str, str]

    @property
    def graph_path(self) -> Path:
        return Path(self.out_dir) / GRAPH_FILE


# The distributions whose versions the encoder stage keys name, by the name the keys use.
ENCODER_TOOL_DISTRIBUTIONS = {"torch": "torch", "transformers": "transformers", "onnx": "onnx",
                              "onnxruntime": "onnxruntime", "modelopt": "nvidia-modelopt"}


def installed_encoder_tools() -> dict[str, str]:
    """The installed versions of the encoder toolchain (a local build suffix such as ``+cpu`` dropped)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name, distribution in ENCODER_TOOL_DISTRIBUTIONS.items():
        try:
            found[name] = version(distribution).split("+")[0]
        except PackageNotFoundError:
            continue
    return found


def check_encoder_tools(expected: dict[str, str]) -> None:
    """Refuse to run a stage under another toolchain than the one its key names (``check_versions``)."""
    check_versions(expected, installed_encoder_tools())


def check_versions(expected: dict[str, str], installed: dict[str, str]) -> None:
    """The key names the toolchain the plan configured; a stage running another one would publish under a key that
    does not describe it. Only the names both dicts have are compared."""
    differ = [f"{name} {want} (the key's) but {installed[name]} here" for name, want in expected.items()
              if name in installed and installed[name] != want]
    if differ:
        raise UserError("this environment is not the toolchain the quantize key was computed for: " + "; ".join(differ),
                        where="toolchains", hint="run the stage in the environment the config's toolchains name, or "
                                                 "change the pin in the config (which changes the key)")


def row_cosines(reference: np.ndarray, candidate: np.ndarray) -> np.ndarray:
    """cos(reference_i, candidate_i) for each row, in float64 (a zero vector counts as norm 1e-12)."""
    import numpy as np

    if reference.shape != candidate.shape:
        raise ValueError(f"shapes differ: {reference.shape} vs {candidate.shape}")
    reference, candidate = np.asarray(reference, dtype=np.float64), np.asarray(candidate, dtype=np.float64)
    norms = np.linalg.norm(reference, axis=1) * np.linalg.norm(candidate, axis=1)
    return (reference * candidate).sum(axis=1) / np.maximum(norms, 1e-12)
