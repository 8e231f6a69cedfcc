"""Serving profiles: the serving settings an artefact was measured with on its SKU (the flags its runtime starts
with), and per concurrency what they gave: throughput and TTFT/TPOT/E2EL percentiles with their spread over the
rounds, and every request's latencies, from which goodput under any SLO is computed. Pure pydantic.

A validated LLM artefact always has one profile, its validation's candidate (the serve recipe as built); a cell
whose config tunes (``tuning:``) publishes the profiles of its sweep instead. A deployment picks among them by
SLO (``enginesmith resolve --slo``): the profile and concurrency with the most goodput that meet it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel

from enginesmith.core.reports import TableView
from enginesmith.core.reports.measures import BenchmarkResult, Spread, fmt_spread
from enginesmith.core.slo import METRIC_LABELS, Slo, meets_bounds

DEFAULT_PROFILE = "as-built"
FRONTIER_PLOT = "frontier.png"


class LevelSamples(BaseModel):
    """Every completed request of a level, pooled over its rounds, in seconds (the order of the requests), and the
    seconds the level measured in all."""

    ttft_s: list[float]
    tpot_s: list[float]
    e2el_s: list[float]
    duration_s: float


class ProfileLevel(BaseModel):
    """One concurrency of a profile: each quantity once per round (its median and spread), and the requests."""

    concurrency: int
    output_throughput: Spread  # tokens/s
    request_throughput: Spread  # requests/s
    # None: the rounds' reports did not have it (p95 is kept since the serving profiles)
    ttft_p50_ms: Spread | None
    ttft_p95_ms: Spread | None
    tpot_p50_ms: Spread | None
    tpot_p95_ms: Spread | None
    e2el_p50_ms: Spread | None
    e2el_p95_ms: Spread | None
    samples: LevelSamples | None = None  # None: a report from before per-request latencies were kept

    def percentile_ms(self, metric: str, percentile: int) -> float | None:
        """The percentile over the pooled requests; without them, the rounds' median of p50 or p95 (else None)."""
        if self.samples is not None:
            values = getattr(self.samples, f"{metric}_s")
            return 1000 * linear_percentile(values, percentile) if values else None
        stored: Spread | None = getattr(self, f"{metric}_p{percentile}_ms", None)
        return stored.median if stored is not None else None

    def goodput(self, slo: Slo) -> float | None:
        """Requests per second within every bound of ``slo`` (vLLM's goodput); None without the requests."""
        if self.samples is None or self.samples.duration_s <= 0:
            return None
        samples = self.samples
        good = sum(meets_bounds(t, p, e, slo) for t, p, e in zip(samples.ttft_s, samples.tpot_s, samples.e2el_s,
                                                                   strict=True))
        return good / samples.duration_s

    def misses(self, slo: Slo) -> list[str]:
        """Each term this level misses: ``p95 TTFT 730 ms > 500 ms``."""
        missed = []
        for term in slo.terms:
            value = self.percentile_ms(term.metric, term.percentile)
            if value is None:
                missed.append(f"{term.label} not measured")
            elif value > term.bound_ms:
                missed.append(f"{term.label} {value:.0f} ms > {term.bound_ms:g} ms")
        return missed


class ServingProfile(BaseModel):
    """Serving settings and what they gave on the SKU they were measured on."""

    name: str  # "max_num_seqs=4", or DEFAULT_PROFILE
    runtime: str  # the serve recipe's runtime: vllm-cpu, vllm, trtllm-pytorch, …
    knobs: dict[str, int | str] = {}  # the runtime's knobs as the tuning section names them
    args: list[str] = []  # what the knobs add to the artefact's serve command
    target: str  # the SKU id it was measured on
    gpus: int = 0  # how many of them (0 on the cpu)
    rounds: int
    levels: list[ProfileLevel]

    def level(self, concurrency: int) -> ProfileLevel | None:
        return next((level for level in self.levels if level.concurrency == concurrency), None)


class ProfileChoice(BaseModel):
    """A profile judged against an SLO: where it meets it best (the level with the most goodput), or why not."""

    profile: str
    concurrency: int | None  # the level chosen; None when no level meets the SLO
    goodput: float | None  # requests/s within the SLO's bounds at that level
    output_throughput: float | None  # tokens/s at that level (the tie-break)
    misses: str  # why it does not meet the SLO ("" when it does)

    @property
    def meets(self) -> bool:
        return self.concurrency is not None


def judge_profile(profile: ServingProfile, slo: Slo, concurrency: int | None = None) -> ProfileChoice:
    """The level of ``profile`` that meets ``slo`` with the most goodput (ties: throughput), at ``concurrency`` only
    where one is asked for; otherwise why none does, at the level that came closest (the lowest concurrency)."""
    levels = sorted(profile.levels, key=lambda level: level.concurrency)
    if concurrency is not None:
        levels = [level for level in levels if level.concurrency == concurrency]
        if not levels:
            measured = ", ".join(f"c={level.concurrency}" for level in profile.levels)
            return ProfileChoice(profile=profile.name, concurrency=None, goodput=None, output_throughput=None,
                                 misses=f"not measured at c={concurrency} (measured at {measured})")
    meeting = [(level, level.goodput(slo)) for level in levels if not level.misses(slo)]
    if not meeting:
        closest = levels[0]
        return ProfileChoice(profile=profile.name, concurrency=None, goodput=None, output_throughput=None,
                             misses=f"misses SLO: {'; '.join(closest.misses(slo))} at c={closest.concurrency}")
    level, goodput = max(meeting, key=lambda pair: (pair[1] if pair[1] is not None else pair[0].request_throughput
                                                    .median, pair[0].output_throughput.median))
    return ProfileChoice(profile=profile.name, concurrency=level.concurrency, goodput=goodput,
                         output_throughput=level.output_throughput.median, misses="")


def best_choice(choices: Sequence[ProfileChoice]) -> ProfileChoice | None:
    """The choice with the most goodput (ties: throughput) among those that meet the SLO."""
    meeting = [choice for choice in choices if choice.meets]
    if not meeting:
        return None
    return max(meeting, key=lambda choice: (choice.goodput or 0.0, choice.output_throughput or 0.0))


def profile_from_levels(name: str, *, runtime: str, levels: Sequence[BenchmarkResult], target: str, gpus: int,
                        knobs: dict[str, int | str] | None = None, args: Sequence[str] = ()) -> ServingProfile:
    """A profile from a side's measured levels (each concurrency once per round)."""
    by_concurrency: dict[int, list[BenchmarkResult]] = {}
    for level in levels:
        if level.concurrency is not None:
            by_concurrency.setdefault(level.concurrency, []).append(level)
    rounds = max((len(found) for found in by_concurrency.values()), default=0)
    return ServingProfile(name=name, runtime=runtime, knobs=dict(knobs or {}), args=list(args), target=target,
                          gpus=gpus, rounds=rounds,
                          levels=[_profile_level(c, found) for c, found in sorted(by_concurrency.items())])


def _profile_level(concurrency: int, rounds: list[BenchmarkResult]) -> ProfileLevel:
    def per_round(field: str) -> Spread:
        return Spread(values=[float(getattr(r, field)) for r in rounds])

    def percentile(metric: str, p: int) -> Spread | None:
        return Spread.of([float(getattr(r, f"median_{metric}_ms")) if p == 50
                          else r.percentiles_ms.get(f"p{p}_{metric}_ms") for r in rounds])

    kept = all(len(r.tpots) == len(r.ttfts) == len(r.e2els) for r in rounds) and any(r.e2els for r in rounds)
    samples = LevelSamples(ttft_s=[t for r in rounds for t in r.ttfts], tpot_s=[t for r in rounds for t in r.tpots],
                           e2el_s=[t for r in rounds for t in r.e2els],
                           duration_s=sum(r.duration for r in rounds)) if kept else None
    return ProfileLevel(
        concurrency=concurrency, output_throughput=per_round("output_throughput"),
        request_throughput=per_round("request_throughput"),
        ttft_p50_ms=percentile("ttft", 50), ttft_p95_ms=percentile("ttft", 95),
        tpot_p50_ms=percentile("tpot", 50), tpot_p95_ms=percentile("tpot", 95),
        e2el_p50_ms=percentile("e2el", 50), e2el_p95_ms=percentile("e2el", 95), samples=samples)


def profile_table(profiles: Sequence[ServingProfile]) -> TableView:
    """Each profile at each concurrency: medians over its rounds (min–max)."""
    rows = []
    for profile in profiles:
        for level in profile.levels:
            rows.append([profile.name, " ".join(profile.args) or "—", str(level.concurrency),
                         fmt_spread(level.output_throughput, ".1f"), fmt_spread(level.request_throughput, ".2f"),
                         *(fmt_spread(spread, ".0f") for spread in (level.ttft_p50_ms, level.ttft_p95_ms,
                                                                    level.tpot_p50_ms, level.tpot_p95_ms,
                                                                    level.e2el_p95_ms))])
    first = profiles[0]
    where = f"{first.gpus} × {first.target}" if first.gpus else first.target
    return TableView(caption=f"Serving profiles measured on {where} ({first.runtime}; {first.rounds} interleaved "
                             "rounds each): medians over the rounds (min–max). A deployment picks one by SLO: "
                             "`enginesmith resolve MODEL --slo ttft_p95<=500ms`.",
                     columns=["profile", "flags", "concurrency", "output tok/s", "requests/s", "TTFT p50 (ms)",
                              "TTFT p95 (ms)", "TPOT p50 (ms)", "TPOT p95 (ms)", "E2EL p95 (ms)"], rows=rows)


def describe_level(level: ProfileLevel) -> str:
    """``c=4: 58 tok/s, p95 TTFT 210 ms, p95 TPOT 38 ms``"""
    parts = [f"c={level.concurrency}: {level.output_throughput.median:.0f} tok/s"]
    for metric in ("ttft", "tpot"):
        value = level.percentile_ms(metric, 95)
        if value is not None:
            parts.append(f"p95 {METRIC_LABELS[metric]} {value:.0f} ms")
    return ", ".join(parts)


def linear_percentile(values: Sequence[float], percentile: float) -> float:
    """numpy's default ("linear") percentile, without numpy (a deployment node has none)."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * percentile / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def plot_frontier(profiles: Sequence[ServingProfile], path: Path, *, title: str) -> Path:
    """The serving frontier: output throughput against p95 TTFT and p95 TPOT, one line per profile through its
    concurrencies (medians over the rounds, bars from min to max). Needs matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for metric, axes in zip(("ttft", "tpot"), panels, strict=True):
        for profile in profiles:
            levels = [level for level in profile.levels if getattr(level, f"{metric}_p95_ms") is not None]
            if not levels:
                continue
            latency = [getattr(level, f"{metric}_p95_ms") for level in levels]
            throughput = [level.output_throughput for level in levels]
            axes.errorbar([s.median for s in latency], [s.median for s in throughput],
                          xerr=[[s.median - s.low for s in latency], [s.high - s.median for s in latency]],
                          yerr=[[s.median - s.low for s in throughput], [s.high - s.median for s in throughput]],
                          marker="o", capsize=3, label=profile.name)
            for level, x, y in zip(levels, latency, throughput, strict=True):
                axes.annotate(f"c={level.concurrency}", (x.median, y.median), textcoords="offset points",
                              xytext=(4, 4), fontsize=8)
        axes.set_xlabel(f"p95 {METRIC_LABELS[metric]} (ms)")
        axes.grid(alpha=0.3)
    panels[0].set_ylabel("output tokens/s")
    panels[0].legend(fontsize=8)
    first = profiles[0]
    figure.suptitle(f"{title} ({first.runtime} on {first.target}, {first.rounds} rounds, min–max)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
