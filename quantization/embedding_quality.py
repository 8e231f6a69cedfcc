"""How close a (quantised) ONNX sentence encoder's embeddings are to a reference, sentence by sentence.

Embeddings come from onnxruntime's CPUExecutionProvider (batched, each batch padded to its longest sentence) or,
for the reference, from the FP32 PyTorch encoder that ``quantization.onnx_export`` wraps (transformers ``AutoModel``
plus the directory's own pooling and normalisation; sentence-transformers is not needed).

Metric: ``cosine_i = a_i · b_i / (‖a_i‖ ‖b_i‖)`` per sentence ``i``; a report carries its minimum and mean.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from enginesmith.core.encoder_graph import EmbeddingAgreement, row_cosines
from enginesmith.core.errors import UserError

if TYPE_CHECKING:
    import numpy as np

DEFAULT_BATCH_SIZE = 32
# An FP32 export should reproduce PyTorch to rounding: anything lower is an export bug, not precision.
EXPORT_MIN_COSINE = 0.9999


class OnnxTiming(BaseModel):
    model_config = ConfigDict(frozen=True)

    onnx_path: Path
    batch_size: int
    threads: int
    median_batch_latency_ms: float = Field(description="median over repeats of one batch's session.run")


def onnx_session(onnx_path: Path, threads: int, optimize: bool = True):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        return ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own untyped Fail/InvalidGraph/NotImplemented
        raise UserError(f"onnxruntime's CPU provider cannot load it: {str(exc).splitlines()[0]}",
                        where=str(onnx_path)) from None


def tokenize_batch(model_dir: Path, sentences: list[str], input_names: list[str], max_length: int):
    import numpy as np
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoded = tokenizer(sentences, padding=True, truncation=True, max_length=max_length, return_tensors="np")
    return {name: np.asarray(encoded[name], dtype=np.int64) for name in input_names}


def onnx_embeddings(onnx_path: Path, model_dir: Path, sentences: list[str], *, batch_size: int = DEFAULT_BATCH_SIZE,
                    threads: int = 2, max_length: int = 256, optimize: bool = True) -> np.ndarray:
    """``[len(sentences), hidden]`` float32 embeddings from the graph's ``sentence_embedding`` output.

    ``optimize=False`` turns onnxruntime's graph optimisations off: an FP8 Q/DQ graph needs it on the CPU provider
    (onnxruntime 1.24 fuses Q/DQ + MatMul into MatMulIntegerToFloat, which has no float8 kernel, and refuses the
    graph); the unfused graph runs each QuantizeLinear/DequantizeLinear pair as written, so the FP8 rounding is
    simulated and the matmuls run in fp32.
    """
    import numpy as np

    session = onnx_session(onnx_path, threads, optimize)
    input_names = [value.name for value in session.get_inputs()]
    chunks = []
    for start in range(0, len(sentences), batch_size):
        feeds = tokenize_batch(model_dir, sentences[start:start + batch_size], input_names, max_length)
        chunks.append(session.run(["sentence_embedding"], feeds)[0])
    return np.concatenate(chunks).astype(np.float32)


def torch_embeddings(model_dir: Path, sentences: list[str], *, batch_size: int = DEFAULT_BATCH_SIZE,
                     max_length: int = 256) -> np.ndarray:
    """The FP32 PyTorch reference: the same transformer, pooling and normalisation the export traces."""
    import numpy as np
    import torch

    from quantization.onnx_export import load_sentence_encoder

    encoder, input_names, _ = load_sentence_encoder(model_dir)
    chunks = []
    with torch.no_grad():
        for start in range(0, len(sentences), batch_size):
            feeds = tokenize_batch(model_dir, sentences[start:start + batch_size], input_names, max_length)
            chunks.append(encoder(*(torch.from_numpy(feeds[name]) for name in input_names)).numpy())
    return np.concatenate(chunks).astype(np.float32)


def compare_embeddings(reference: np.ndarray, candidate: np.ndarray, sentences: list[str], *,
                       reference_name: str, candidate_name: str) -> EmbeddingAgreement:
    """Per-sentence cosine similarity (formula in the module docstring), summarised as min and mean."""
    if reference.shape != candidate.shape or reference.shape[0] != len(sentences):
        raise ValueError(f"shapes differ: {reference.shape} vs {candidate.shape} for {len(sentences)} sentences")
    cosine = row_cosines(reference, candidate)
    worst = int(cosine.argmin())
    return EmbeddingAgreement(reference=reference_name, candidate=candidate_name, sentences=len(sentences),
                              min_cosine=float(cosine.min()), mean_cosine=float(cosine.mean()),
                              worst_sentence=sentences[worst])


def onnx_agreement(reference_onnx: Path, candidate_onnx: Path, model_dir: Path, sentences: list[str], *,
                   threads: int = 2, optimize_candidate: bool = True) -> EmbeddingAgreement:
    """Cosine agreement of ``candidate_onnx`` (e.g. int8) with ``reference_onnx`` (e.g. the FP32 export)."""
    return compare_embeddings(onnx_embeddings(reference_onnx, model_dir, sentences, threads=threads),
                              onnx_embeddings(candidate_onnx, model_dir, sentences, threads=threads,
                                              optimize=optimize_candidate), sentences,
                              reference_name=str(reference_onnx), candidate_name=str(candidate_onnx))


def export_agreement(onnx_path: Path, model_dir: Path, sentences: list[str], *, threads: int = 2
                     ) -> EmbeddingAgreement:
    """Cosine agreement of an FP32 export with the PyTorch encoder it came from."""
    return compare_embeddings(torch_embeddings(model_dir, sentences),
                              onnx_embeddings(onnx_path, model_dir, sentences, threads=threads), sentences,
                              reference_name=f"pytorch fp32 {model_dir}", candidate_name=str(onnx_path))


def time_onnx_batch(onnx_path: Path, model_dir: Path, sentences: list[str], *, batch_size: int = DEFAULT_BATCH_SIZE,
                    threads: int = 2, repeats: int = 10) -> OnnxTiming:
    """Median wall time of ``session.run`` on the first ``batch_size`` sentences (one warm-up run first)."""
    import statistics

    session = onnx_session(onnx_path, threads)
    input_names = [value.name for value in session.get_inputs()]
    feeds = tokenize_batch(model_dir, sentences[:batch_size], input_names, 256)
    session.run(["sentence_embedding"], feeds)
    laps = []
    for _ in range(repeats):
        started = time.perf_counter()
        session.run(["sentence_embedding"], feeds)
        laps.append((time.perf_counter() - started) * 1000)
    return OnnxTiming(onnx_path=onnx_path, batch_size=min(batch_size, len(sentences)), threads=threads,
                      median_batch_latency_ms=round(statistics.median(laps), 3))
