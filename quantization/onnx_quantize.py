"""ModelOpt ONNX post-training quantisation of an exported sentence encoder, on the CPU.

``modelopt.onnx.quantization.quantize`` (nvidia-modelopt 0.47.0) inserts explicit QuantizeLinear/DequantizeLinear
pairs whose scales come from calibrating with onnxruntime's CPUExecutionProvider on real sentences: the lines of a
text file, tokenised by the model's own tokenizer and padded to a fixed length, given as a dict of int64 arrays
``{input name: [sentences, sequence_length]}`` and fed ``calibration_batch_size`` rows at a time.

Opset floors are ours and checked before ModelOpt runs: int8 needs 13, fp8 21 (the exports this project builds).
ModelOpt 0.47 itself would not refuse a lower opset: it raises any graph below opset 19 to 19 (``BASE_MIN_OPSET``)
with onnx's version converter, so the quantised graph's opset is ``max(input opset, 19)``. FP8 quantisation runs
on the CPU here (calibration is fp32 onnxruntime; the FP8 Q/DQ nodes are only written, not executed). onnxruntime
1.24's CPU provider runs the FP8 graph only with graph optimisations off (its fusion into MatMulIntegerToFloat
rejects float8 inputs), see ``quantization.embedding_quality``; which GPUs may run it is the planner's SM rule.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from enginesmith.core.assets import EMBEDDING_CALIBRATION_FILE, EMBEDDING_HELD_OUT_FILE
from enginesmith.core.encoder_graph import OnnxQuantizeResult, OnnxQuantMode
from enginesmith.core.errors import UserError
from quantization.onnx_export import check_onnx_file, default_opset

if TYPE_CHECKING:
    import numpy as np

CALIBRATION_FILE = EMBEDDING_CALIBRATION_FILE
HELD_OUT_FILE = EMBEDDING_HELD_OUT_FILE
MIN_CALIBRATION_SENTENCES = 16
MIN_OPSET: dict[str, int] = {"int8": 13, "fp8": 21}


class OnnxQuantizeRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    onnx_path: Path  # the FP32 export (quantization.onnx_export)
    model_dir: Path  # for its tokenizer
    output_path: Path
    mode: OnnxQuantMode = "int8"
    calibration_method: Literal["max", "entropy"] = "max"
    calibration_file: Path = CALIBRATION_FILE
    sequence_length: int = Field(128, ge=8, le=512)
    calibration_batch_size: int = Field(16, ge=1)
    # Precision of what is not quantised: fp32 keeps the graph runnable and comparable on onnxruntime's CPU
    # provider; fp16 (ModelOpt's default) is what a TensorRT engine would want.
    high_precision_dtype: Literal["fp32", "fp16"] = "fp32"
    # Residual Adds stay unquantised: quantising them (ModelOpt's default) put the FFN output's outliers on one
    # per-tensor int8 scale, and the int8 embeddings fell to cosine min 0.78 / mean 0.87 against fp32 on the held-out
    # sentences (max or entropy alike); without them, 0.966 / 0.977.
    op_types_to_exclude: tuple[str, ...] = ("Add",)
    # Node-name regexes left unquantised. Measured (int8 max): the FFN matmuls carry most of the remaining loss;
    # leaving ".*/intermediate/dense/MatMul" (6 of the 48 matmuls) in fp32 gave min 0.979 / mean 0.986.
    nodes_to_exclude: tuple[str, ...] = ()
    # Weights stored quantised, behind a DequantizeLinear only (ModelOpt's dq_only): measured on all-MiniLM-L6-v2
    # int8, the graph falls from 86.6 to 56.0 MiB (the FP32 word-embedding table is most of what is left) with the
    # same embeddings (cosine to FP32 identical to the Q/DQ-on-weights graph's, min 0.9662 on the held-out set).
    weights_stored_quantized: bool = True


def read_sentences(path: Path) -> list[str]:
    """The non-blank lines of ``path``, stripped."""
    try:
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as exc:
        raise UserError(f"cannot read the sentence file: {exc.strerror}", where=str(path)) from None


def calibration_inputs(model_dir: Path, sentences: list[str], input_names: list[str],
                       sequence_length: int) -> dict[str, np.ndarray]:
    """The tokenised sentences as ``{input name: int64 [len(sentences), sequence_length]}``, padded and truncated."""
    import numpy as np
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoded = tokenizer(sentences, padding="max_length", truncation=True, max_length=sequence_length,
                        return_tensors="np")
    missing = [name for name in input_names if name not in encoded]
    if missing:
        raise UserError(f"the tokenizer produces no {', '.join(missing)} for the graph's inputs",
                        where=str(model_dir))
    return {name: np.ascontiguousarray(encoded[name], dtype=np.int64) for name in input_names}


def _graph_inputs(onnx_path: Path) -> list[str]:
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    initialisers = {init.name for init in graph.initializer}
    return [value.name for value in graph.input if value.name not in initialisers]


def qdq_summary(onnx_path: Path) -> tuple[int, int, dict[str, int]]:
    """(QuantizeLinear count, DequantizeLinear count, {op type: nodes fed by a DequantizeLinear})."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    counts = collections.Counter(node.op_type for node in graph.node)
    dequantized = {out for node in graph.node if node.op_type == "DequantizeLinear" for out in node.output}
    consumers = collections.Counter(node.op_type for node in graph.node
                                    if node.op_type not in ("QuantizeLinear", "DequantizeLinear")
                                    and any(name in dequantized for name in node.input))
    return counts["QuantizeLinear"], counts["DequantizeLinear"], dict(sorted(consumers.items()))


def quantize_encoder(request: OnnxQuantizeRequest) -> OnnxQuantizeResult:
    """Quantise ``request.onnx_path`` into ``request.output_path`` with ModelOpt's ONNX PTQ on the CPU.

    Refuses, before ModelOpt runs: a graph that fails ``onnx.checker`` (naming the file), an opset below the mode's
    floor (naming both opsets), and a calibration file with fewer than ``MIN_CALIBRATION_SENTENCES`` sentences
    (naming the file).
    """
    check_onnx_file(request.onnx_path)
    input_opset = default_opset(request.onnx_path)
    floor = MIN_OPSET[request.mode]
    if input_opset < floor:
        raise UserError(f"{request.mode} quantisation needs opset {floor} or newer; this graph is opset {input_opset}",
                        where=str(request.onnx_path),
                        hint=f"export the encoder again with opset={floor} (quantization.onnx_export)")
    sentences = read_sentences(request.calibration_file)
    if len(sentences) < MIN_CALIBRATION_SENTENCES:
        raise UserError(f"{len(sentences)} calibration sentences; at least {MIN_CALIBRATION_SENTENCES} are needed "
                        "for stable activation ranges", where=str(request.calibration_file),
                        hint="add more varied sentences, one per line")
    input_names = _graph_inputs(request.onnx_path)
    calibration_data = calibration_inputs(request.model_dir, sentences, input_names, request.sequence_length)
    batch = min(request.calibration_batch_size, len(sentences))
    usable = len(sentences) - len(sentences) % batch  # ModelOpt drops a ragged last batch; say so by counting
    calibration_data = {name: array[:usable] for name, array in calibration_data.items()}
    calibration_shapes = ",".join(f"{name}:{batch}x{request.sequence_length}" for name in input_names)

    from modelopt.onnx.quantization import quantize

    request.output_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    quantize(onnx_path=str(request.onnx_path), quantize_mode=request.mode, calibration_data=calibration_data,
             calibration_method=request.calibration_method, calibration_shapes=calibration_shapes,
             calibration_eps=["cpu"], output_path=str(request.output_path),
             high_precision_dtype=request.high_precision_dtype,
             op_types_to_exclude=list(request.op_types_to_exclude) or None,
             nodes_to_exclude=list(request.nodes_to_exclude) or None, dq_only=request.weights_stored_quantized,
             log_level="WARNING")
    quantize_seconds = time.perf_counter() - started
    if not request.output_path.is_file():
        raise UserError("ModelOpt finished without writing the quantised graph", where=str(request.output_path))
    check_onnx_file(request.output_path)
    q_nodes, dq_nodes, consumers = qdq_summary(request.output_path)
    return OnnxQuantizeResult(output_path=request.output_path, mode=request.mode,
                              calibration_method=request.calibration_method, input_opset=input_opset,
                              output_opset=default_opset(request.output_path), calibration_sentences=usable,
                              sequence_length=request.sequence_length, quantize_linear_nodes=q_nodes,
                              dequantize_linear_nodes=dq_nodes, quantized_op_types=consumers,
                              quantize_seconds=round(quantize_seconds, 3))
