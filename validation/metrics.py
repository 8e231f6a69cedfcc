"""Serving metrics with `vllm bench serve`'s definitions and JSON names (vLLM's benchmarks/serve).

Per request (client clock, ``time.perf_counter``):
- TTFT: request sent → first SSE message whose ``choices`` is non-empty.
- ITL: gaps between consecutive choices-bearing messages (per chunk, not per token).
- E2EL (latency): request sent → last choices-bearing message (the usage-only chunk and [DONE] don't count).
- output tokens: ``usage.completion_tokens`` of the stream (re-tokenised text only when the server sends none).
- TPOT: (E2EL − TTFT) / (output_tokens − 1), only for requests with more than one output token.
A request fails on a non-200 status, an exception, a malformed ``data:`` line, or a stream without a
choices-bearing message; failed requests are counted, never dropped, and named by their ``x-request-id``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from pydantic import BaseModel

from enginesmith.core.reports.measures import BenchmarkResult, Spread
from enginesmith.core.slo import Slo, meets_bounds

__all__ = ["BenchmarkResult", "RequestRecord", "Spread", "summarize"]

PERCENTILES = (50, 90, 95, 99)


class RequestRecord(BaseModel):
    success: bool
    prompt_len: int
    output_tokens: int = 0
    ttft_s: float = 0.0
    itl_s: list[float] = []
    latency_s: float = 0.0
    start_s: float = 0.0  # since the benchmark started
    error: str = ""
    request_id: str = ""  # the x-request-id it was sent with, to find it in the server's log

    @property
    def tpot_s(self) -> float | None:
        """(E2EL − TTFT) / (output_tokens − 1); None for a request with one output token or none."""
        if not self.success or self.output_tokens <= 1:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


def _stats_ms(values_s: Sequence[float]) -> tuple[float, float, float]:
    """(mean, median, std) in ms; zeros for no values, as vLLM reports them."""
    if not values_s:
        return 0.0, 0.0, 0.0
    array = np.asarray(values_s, dtype=float) * 1000
    return float(array.mean()), float(np.median(array)), float(array.std())


def _percentile_ms(values_s: Sequence[float], percentile: float) -> float:
    """numpy's default (linear) interpolation, as vLLM uses."""
    return float(np.percentile(np.asarray(values_s, dtype=float) * 1000, percentile)) if values_s else 0.0


def max_output_tokens_per_second(records: Iterable[RequestRecord]) -> float:
    """Output tokens bucketed by the wall-clock second each request finished in; the busiest second.
    (vLLM spreads each request's tokens over its chunk arrival times; a request's tokens are attributed to
    the seconds of its chunks here too.)"""
    buckets: dict[int, float] = {}
    for record in records:
        if not record.success or record.output_tokens == 0:
            continue
        arrivals = [record.start_s + record.ttft_s]
        for gap in record.itl_s:
            arrivals.append(arrivals[-1] + gap)
        per_chunk = record.output_tokens / len(arrivals)
        for arrival in arrivals:
            buckets[math.floor(arrival)] = buckets.get(math.floor(arrival), 0.0) + per_chunk
    return max(buckets.values(), default=0.0)


def summarize(records: Sequence[RequestRecord], duration_s: float, *, concurrency: int | None = None,
              request_rate: float | None = None, slo: Slo | None = None) -> BenchmarkResult:
    """Aggregate per-request records into one load level's result."""
    done = [r for r in records if r.success]
    ttfts = [r.ttft_s for r in done]
    tpots = [t for r in done if (t := r.tpot_s) is not None]
    itls = [gap for r in done for gap in r.itl_s]
    latencies = [r.latency_s for r in done]
    input_tokens = sum(r.prompt_len for r in done)
    output_tokens = sum(r.output_tokens for r in done)
    stats = {name: _stats_ms(values) for name, values in
             (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", latencies))}
    percentiles = {
        f"p{p}_{name}_ms": _percentile_ms(values, p)
        for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", latencies))
        for p in PERCENTILES
    }
    goodput = None
    if slo is not None:
        goodput = sum(meets_bounds(r.ttft_s, r.tpot_s or 0.0, r.latency_s, slo) for r in done) / duration_s
    return BenchmarkResult(
        concurrency=concurrency, request_rate=request_rate, duration=duration_s, completed=len(done),
        failed=len(records) - len(done), total_input_tokens=input_tokens, total_output_tokens=output_tokens,
        request_throughput=len(done) / duration_s, request_goodput=goodput,
        output_throughput=output_tokens / duration_s,
        total_token_throughput=(input_tokens + output_tokens) / duration_s,
        max_output_tokens_per_s=max_output_tokens_per_second(done),
        mean_ttft_ms=stats["ttft"][0], median_ttft_ms=stats["ttft"][1], std_ttft_ms=stats["ttft"][2],
        mean_tpot_ms=stats["tpot"][0], median_tpot_ms=stats["tpot"][1], std_tpot_ms=stats["tpot"][2],
        mean_itl_ms=stats["itl"][0], median_itl_ms=stats["itl"][1], std_itl_ms=stats["itl"][2],
        mean_e2el_ms=stats["e2el"][0], median_e2el_ms=stats["e2el"][1], std_e2el_ms=stats["e2el"][2],
        percentiles_ms=percentiles,
        all_at_once_requests=sum(1 for r in done if r.output_tokens > 1 and r.latency_s <= r.ttft_s), ttfts=ttfts,
        tpots=[r.tpot_s or 0.0 for r in done], e2els=latencies, errors=failure_summary(records),
    )


def failure_summary(records: Iterable[RequestRecord], *, reasons: int = 10, ids_per_reason: int = 5) -> list[str]:
    """One line per distinct failure reason, most frequent first: the reason, how many requests failed with it and
    the first of their request ids (``"HTTP 500: boom — 3 requests: r1-4, r1-9, r1-17"``)."""
    ids_by_reason: dict[str, list[str]] = {}
    for record in records:
        if not record.success:
            ids_by_reason.setdefault(record.error, []).append(record.request_id)
    lines = []
    for reason, ids in sorted(ids_by_reason.items(), key=lambda item: (-len(item[1]), item[0]))[:reasons]:
        named = [request_id for request_id in ids if request_id]
        listed = f": {', '.join(named[:ids_per_reason])}{', …' if len(named) > ids_per_reason else ''}" if named else ""
        lines.append(f"{reason} — {len(ids)} request{'s' if len(ids) > 1 else ''}{listed}")
    return lines
