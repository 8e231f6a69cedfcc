"""Validating an encoder artefact: the candidate, the unquantised graph on the same runtime and vLLM's embeddings
of the checkpoint (the reference), all three behind ``/v1/embeddings`` at once, measured on the same inputs.

- accuracy: per-sentence cosine of each side's embeddings to the reference's (min and mean) over every query and
  document of the shipped retrieval set, and each side's recall@k on it;
- speed: embeddings/s and request latency per batch size, in interleaved rounds (the order of the sides rotates
  from level to level and round to round), each reported with its spread;
- gates: the candidate's minimum cosine to the reference (per recipe), its recall@k drop from the reference's,
  and its throughput against the unquantised graph's at the largest batch size (per-round ratios: a margin
  inside their spread is reported as such).

For the ``fp32`` recipe the candidate *is* the unquantised graph: its speed gate is an A/A check of the harness.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Literal

from enginesmith.core.reports.encoder import BASELINE, CANDIDATE, REFERENCE, EncoderSide, EncoderValidationReport
from enginesmith.core.reports.measures import GateResult, Spread
from enginesmith.core.specs import EncoderGateSpec, EncoderWorkloadSpec
from validation.embeddings import (
    BatchRun,
    cosine_agreement,
    embed_texts,
    load_retrieval_set,
    measure_throughput,
    recall_at_k,
    serving_onnx_embeddings,
    serving_vllm_cpu_embeddings,
)
from validation.gates import _performance_gate
from validation.server import Endpoint

SideName = Literal["candidate", "fp32-onnx", "reference"]


def baseline_artefact(candidate_dir: Path, fp32_graph: Path, dest: Path) -> Path:
    """A servable directory of the unquantised graph: the candidate's tokenizer and serving config beside it."""
    from validation.embeddings_server import MODEL_FILE, SERVE_CONFIG_FILE, TOKENIZER_FILE

    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(fp32_graph, dest / MODEL_FILE)
    for name in (TOKENIZER_FILE, SERVE_CONFIG_FILE):
        shutil.copyfile(candidate_dir / name, dest / name)
    return dest


@contextmanager
def serving_three(artefact_dir: Path, baseline_dir: Path, checkpoint_dir: Path, logs: Path
                  ) -> Iterator[dict[str, Endpoint]]:
    """The candidate, the unquantised graph and the vLLM reference, all up (each stopped on the way out)."""
    logs.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        endpoints = {
            CANDIDATE: stack.enter_context(serving_onnx_embeddings(artefact_dir, log_path=logs / "candidate.log",
                                                                   model_name=CANDIDATE)),
            BASELINE: stack.enter_context(serving_onnx_embeddings(baseline_dir, log_path=logs / "fp32-onnx.log",
                                                                  model_name=BASELINE)),
            REFERENCE: stack.enter_context(serving_vllm_cpu_embeddings(checkpoint_dir, log_path=logs / "reference.log",
                                                                       model_name=REFERENCE)),
        }
        yield endpoints


def per_round_ratio(runs: list[BatchRun], batch_size: int, numerator: str, denominator: str) -> Spread:
    """numerator's embeddings/s ÷ denominator's, round by round, at ``batch_size``."""
    by_round: dict[tuple[str, int], float] = {(r.side, r.round): r.embeddings_per_s for r in runs
                                              if r.batch_size == batch_size}
    rounds = sorted({r for (_, r) in by_round})
    return Spread(values=[by_round[(numerator, r)] / by_round[(denominator, r)] for r in rounds])


def encoder_gates(recipe: str, sides: dict[str, EncoderSide], ratio: Spread, gates: EncoderGateSpec
                  ) -> list[GateResult]:
    candidate, reference = sides[CANDIDATE], sides[REFERENCE]
    min_cosine = gates.min_cosine_for(recipe)
    drop = reference.retrieval.recall_at_k - candidate.retrieval.recall_at_k
    return [
        GateResult(name="min_cosine_to_reference", measured=round(candidate.cosine_to_reference.min_cosine, 6),
                   limit=min_cosine, passed=candidate.cosine_to_reference.min_cosine >= min_cosine,
                   detail=f"lowest per-sentence cosine to vLLM's embeddings, {recipe} recipe (mean "
                          f"{candidate.cosine_to_reference.mean_cosine:.6f})"),
        GateResult(name=f"recall@{candidate.retrieval.k}_drop", measured=round(drop, 6),
                   limit=gates.max_recall_drop, passed=drop <= gates.max_recall_drop,
                   detail=f"reference {reference.retrieval.recall_at_k:.3f}, "
                          f"candidate {candidate.retrieval.recall_at_k:.3f}"),
        # Rounds are not extended for encoders: a margin inside the spread is decided on the median, and says so.
        _performance_gate("throughput_ratio_vs_fp32_onnx", ratio, gates.min_throughput_ratio, at_least=True,
                          final=True, detail="embeddings/s at the largest batch, candidate ÷ fp32-onnx per round"),
    ]


def validate_encoder(*, cell: str, key: str, artefact_key: str, recipe: str, artefact_dir: Path, fp32_graph: Path,
                     checkpoint_dir: Path, work: Path, workload: EncoderWorkloadSpec, gates: EncoderGateSpec,
                     describe: str) -> EncoderValidationReport:
    """Serve the three sides, measure and decide. ``describe`` says what the candidate is, for the report."""
    retrieval_set = load_retrieval_set()
    texts = [q.text for q in retrieval_set.queries] + [d.text for d in retrieval_set.documents]
    queries = len(retrieval_set.queries)
    baseline_dir = baseline_artefact(artefact_dir, fp32_graph, work / "fp32-onnx")
    with serving_three(artefact_dir, baseline_dir, checkpoint_dir, work / "logs") as endpoints:
        vectors = {name: embed_texts(endpoint, texts) for name, endpoint in endpoints.items()}
        levels, runs = measure_throughput(endpoints, texts, batch_sizes=workload.batch_sizes,
                                          rounds=workload.repeats, requests=workload.requests,
                                          warmup=workload.warmup_requests)
    what = {CANDIDATE: describe, BASELINE: "FP32 ONNX export on onnxruntime (cpu)",
            REFERENCE: "vLLM (vllm-cpu, --runner pooling, float32) on the checkpoint"}
    sides = {name: EncoderSide(
        name=name, what=what[name], cosine_to_reference=cosine_agreement(vectors[name], vectors[REFERENCE]),
        retrieval=recall_at_k(vectors[name][:queries], vectors[name][queries:], retrieval_set, k=workload.recall_k))
        for name in (CANDIDATE, BASELINE, REFERENCE)}
    largest = max(workload.batch_sizes)
    ratio = per_round_ratio(runs, largest, CANDIDATE, BASELINE)
    results = encoder_gates(recipe, sides, ratio, gates)
    return EncoderValidationReport(cell=cell, key=key, artefact_key=artefact_key, recipe=recipe,
                                   sides=list(sides.values()), throughput=levels, throughput_ratio=ratio,
                                   largest_batch=largest, gates=results, passed=all(g.passed for g in results),
                                   rounds=workload.repeats, texts=len(texts))
