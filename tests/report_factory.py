"""Validation reports as validation writes them (the vocabulary's models, dumped to JSON), with the numbers a test
chooses: what the registry, history and the catalogue read."""

from __future__ import annotations

from itertools import cycle, islice
from typing import Any

from enginesmith.core.reports.encoder import EncoderSide, EncoderValidationReport
from enginesmith.core.reports.llm import Comparison, SideReport, ValidationReport
from enginesmith.core.reports.measures import (
    BenchmarkResult,
    CosineAgreement,
    GateResult,
    RetrievalScore,
    ServerCapabilities,
    Spread,
    TaskScore,
    ThroughputLevel,
)
from enginesmith.core.specs import WorkloadSpec

REFERENCE_TOK_S = [100.0, 101.0, 99.0]


def level(concurrency: int, round_index: int, throughput: float, tpot_ms: float) -> BenchmarkResult:
    return BenchmarkResult(
        concurrency=concurrency, request_rate=None, duration=10.0, completed=64, failed=0, total_input_tokens=8192,
        total_output_tokens=8192, request_throughput=6.4, request_goodput=None, output_throughput=throughput,
        total_token_throughput=2 * throughput, max_output_tokens_per_s=throughput * 1.2, mean_ttft_ms=20.0,
        median_ttft_ms=19.0, std_ttft_ms=2.0, mean_tpot_ms=tpot_ms, median_tpot_ms=tpot_ms, std_tpot_ms=0.5,
        mean_itl_ms=tpot_ms, median_itl_ms=tpot_ms, std_itl_ms=0.5, mean_e2el_ms=tpot_ms * 128,
        median_e2el_ms=tpot_ms * 128, std_e2el_ms=5.0, percentiles_ms={"p99_ttft_ms": 30.0, "p99_itl_ms": 12.0},
        ttfts=[0.018, 0.019, 0.021], round=round_index)


def side(role: str, throughputs: list[float], tpot_ms: float, accuracy: float | None = None) -> SideReport:
    """A side measured at concurrency 1 and 4 in each round; ``throughputs`` are its c=1 tokens/s per round."""
    levels = [level(c, r, throughput * (1 if c == 1 else 3), tpot_ms) for r, throughput in enumerate(throughputs)
              for c in (1, 4)]
    scores = [] if accuracy is None else [TaskScore(task="addition", metric="exact_match", value=accuracy,
                                                    examples=50, source="enginesmith")]
    return SideReport(role=role, name=f"{role}-server", runtime="vllm-cpu", levels=levels,
                      peak_memory_bytes=2 * 2**30, memory_source="process-rss", kv_cache_usage_max=None,
                      accuracy=scores, capabilities=ServerCapabilities(vllm_extensions=True, prompt_logprobs=False))


def llm_report(throughput_ratios: list[float], tpot_ratios: list[float] | None = None, *,
               e2el_ratios: list[float] | None = None, accuracy: float | None = None, passed: bool = True,
               artefact_key: str | None = None, key: str | None = None, recipe: str = "fp8", note: str = "",
               tpot_ms: float = 10.0, cell: str | None = None, peak_tok_s: float | None = None,
               peak_tok_s_by_round: list[float] | None = None, target: str = "cpu") -> dict[str, Any]:
    """An LLM report whose per-round ratios are the ones given (one round per throughput ratio); ``peak_tok_s``:
    the candidate's best level in every round (its ``max_output_throughput``), whatever the ratios."""
    reference = list(islice(cycle(REFERENCE_TOK_S), len(throughput_ratios)))
    candidate = [ratio * ref for ratio, ref in zip(throughput_ratios, reference, strict=True)]
    if peak_tok_s is not None:  # the c=4 level runs at 3× the c=1 one
        candidate = [peak_tok_s / 3] * len(throughput_ratios)
    if peak_tok_s_by_round is not None:
        candidate = [peak / 3 for peak in peak_tok_s_by_round]
    ratios = Spread(values=throughput_ratios)
    comparison = Comparison(
        candidate=side("candidate", candidate, tpot_ms, accuracy), reference=side("reference", reference, 10.0),
        rounds=len(throughput_ratios), throughput_ratios=ratios,
        tpot_ratios=Spread(values=tpot_ratios) if tpot_ratios else None,
        e2el_ratios=Spread(values=e2el_ratios) if e2el_ratios else None, memory_ratio=0.6, greedy_agreement=0.98,
        greedy_agreement_tokens=32)
    gates = [GateResult(name="min_throughput_ratio", measured=ratios.median, limit=0.5, passed=passed,
                        detail=f"candidate ÷ reference {note}", low=ratios.low, high=ratios.high,
                        rounds=len(throughput_ratios))]
    report = ValidationReport(recipe=recipe, target=target, workload=WorkloadSpec(name="nightly", concurrency=[1, 4]),
                              comparison=comparison, gates=gates, passed=passed, notes=[note] if note else [],
                              created="2026-11-01T02:00:00+00:00", artefact_key=artefact_key, key=key, cell=cell)
    return report.model_dump(mode="json")


def encoder_report(artefact_key: str, key: str, *, what: str = "", throughput_ratios: list[float] | None = None,
                   min_cosine: float = 0.99, recall: float = 0.9, k: int = 3, cell: str = "minilm/int8/cpu/onnx",
                   candidate_embeddings_per_s: dict[int, float] | None = None,
                   candidate_latency_ms: dict[int, float] | None = None, gate_detail: str = "") -> dict[str, Any]:
    """An encoder report (three sides, batch sizes 1 and 8, three rounds) with the candidate's numbers given."""
    per_s = candidate_embeddings_per_s or {}
    latency = candidate_latency_ms or {}
    sides = [EncoderSide(name=name, what=f"{name} {what}".strip(),
                         cosine_to_reference=CosineAgreement(inputs=40, min_cosine=min_cosine if name == "candidate"
                                                             else 1.0, mean_cosine=0.995),
                         retrieval=RetrievalScore(k=k, queries=10, recall_at_k=recall, missed=[]))
             for name in ("candidate", "fp32-onnx", "reference")]

    def speed(name: str, batch: int) -> Spread:
        median = per_s.get(batch) if name == "candidate" else None
        return Spread(values=[median] * 3 if median else [100.0 * batch, 110.0 * batch, 105.0 * batch])

    def delay(name: str, batch: int) -> Spread:
        median = latency.get(batch) if name == "candidate" else None
        return Spread(values=[median] * 3 if median else [5.0, 5.5, 6.0])

    levels = [ThroughputLevel(side=s.name, batch_size=batch, embeddings_per_s=speed(s.name, batch),
                              median_latency_ms=delay(s.name, batch)) for s in sides for batch in (1, 8)]
    gates = [GateResult(name="min_cosine_to_reference", measured=min_cosine, limit=0.98, passed=True,
                        detail=gate_detail)]
    report = EncoderValidationReport(cell=cell, key=key, artefact_key=artefact_key, recipe="int8", sides=sides,
                                     throughput=levels, throughput_ratio=Spread(values=throughput_ratios or
                                                                                [1.4, 1.5, 1.6]),
                                     largest_batch=8, gates=gates, passed=True, rounds=3, texts=40)
    return report.model_dump(mode="json")
