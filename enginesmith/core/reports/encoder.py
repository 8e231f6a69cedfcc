"""An encoder cell's validation report: the candidate graph, the unquantised graph and vLLM's embeddings of the
checkpoint, compared on the same texts; speed per batch size over interleaved rounds; the gates."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from enginesmith.core.reports import Objective, ReportView, TableView, gate_table, markdown_table
from enginesmith.core.reports.measures import (
    CosineAgreement,
    GateResult,
    RetrievalScore,
    Spread,
    ThroughputLevel,
    fmt_ratio,
)
from enginesmith.core.reports.profiles import ServingProfile

CANDIDATE, BASELINE, REFERENCE = "candidate", "fp32-onnx", "reference"
THROUGHPUT_PLOT = "throughput.png"


class EncoderSide(BaseModel):
    name: str
    what: str  # e.g. "int8 ONNX on onnxruntime (cpu)"
    cosine_to_reference: CosineAgreement
    retrieval: RetrievalScore


class EncoderValidationReport(BaseModel):
    """What encoder validation measured and decided; stored in the manifest as the artefact's validation."""

    kind: Literal["encoder"] = "encoder"
    cell: str
    key: str  # the validation key (the registry key)
    artefact_key: str
    recipe: str
    sides: list[EncoderSide]
    throughput: list[ThroughputLevel]
    throughput_ratio: Spread  # candidate / fp32-onnx embeddings/s at the largest batch size, per round
    largest_batch: int
    gates: list[GateResult]
    passed: bool
    rounds: int
    texts: int

    def side(self, name: str) -> EncoderSide:
        return next(s for s in self.sides if s.name == name)

    def level(self, side: str, batch_size: int) -> ThroughputLevel:
        return next(t for t in self.throughput if t.side == side and t.batch_size == batch_size)

    def round_metrics(self) -> dict[str, Spread]:
        return {"throughput_ratio": self.throughput_ratio}

    def accuracy(self) -> dict[str, float]:
        candidate = self.side(CANDIDATE)
        return {"min_cosine": candidate.cosine_to_reference.min_cosine,
                f"recall@{candidate.retrieval.k}": candidate.retrieval.recall_at_k}

    def serving_profiles(self) -> list[ServingProfile]:
        return []  # the encoder kind publishes no serving profiles yet

    def objective_spread(self, objective: Objective) -> Spread | None:
        """Embeddings/s at the largest batch size, or the median request latency at the smallest."""
        levels = [level for level in self.throughput if level.side == CANDIDATE]
        if not levels:
            return None
        if objective == "throughput":
            return max(levels, key=lambda level: level.batch_size).embeddings_per_s
        return min(levels, key=lambda level: level.batch_size).median_latency_ms

    def speed_checks_harness(self) -> bool:
        return False  # the candidate runs its own graph (int8 against fp32): its speed is its own

    def tables(self) -> list[TableView]:
        accuracy = [[s.name, s.what, f"{s.cosine_to_reference.min_cosine:.6f}",
                     f"{s.cosine_to_reference.mean_cosine:.6f}", f"{s.retrieval.recall_at_k:.3f} (k={s.retrieval.k})"]
                    for s in self.sides]
        speed = []
        for batch_size in sorted({t.batch_size for t in self.throughput}):
            try:
                cells = [f"{lv.embeddings_per_s.median:.1f} [{lv.embeddings_per_s.low:.1f}–"
                         f"{lv.embeddings_per_s.high:.1f}], {lv.median_latency_ms.median:.1f} ms"
                         for lv in (self.level(s.name, batch_size) for s in self.sides)]
                ratio = (self.level(CANDIDATE, batch_size).embeddings_per_s.median
                         / self.level(BASELINE, batch_size).embeddings_per_s.median)
            except StopIteration:  # a side not measured at this batch size
                continue
            speed.append([str(batch_size), *cells, f"{ratio:.2f}"])
        return [
            TableView(caption="Accuracy against the vLLM reference",
                      columns=["side", "what", "cosine min", "cosine mean", "recall@k"], rows=accuracy),
            TableView(caption="Speed: embeddings/s, median over rounds [low–high]; latency median",
                      columns=["batch", *(s.name for s in self.sides), f"{CANDIDATE} ÷ {BASELINE}"], rows=speed),
            gate_table(self.gates, measured_spec=".6g"),
        ]

    def view(self) -> ReportView:
        return ReportView(kind=self.kind, title=f"Validation of {self.cell}", passed=self.passed, tables=self.tables(),
                          summary=f"{self.cell}: {self.texts} texts, {self.rounds} interleaved rounds",
                          throughput_ratio=fmt_ratio(self.throughput_ratio))

    def markdown(self) -> str:
        lines = [f"# Validation of {self.cell}", "",
                 f"Verdict: **{'PASSED' if self.passed else 'FAILED'}** · key `{self.key[:12]}` · "
                 f"{self.texts} texts · {self.rounds} interleaved rounds"]
        for table in self.tables():
            lines += ["", f"## {table.caption}", "", *markdown_table(table)]
            if table.caption.startswith("Speed"):
                lines += ["", f"![embeddings/s per batch size]({THROUGHPUT_PLOT})"]
        return "\n".join(lines) + "\n"

    def plots(self, out_dir: Path) -> list[Path]:
        """Embeddings/s against batch size for each side: the median over rounds, bars from the slowest round to
        the fastest."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(figsize=(6, 4))
        for side in self.sides:
            levels = sorted((t for t in self.throughput if t.side == side.name), key=lambda t: t.batch_size)
            medians = [t.embeddings_per_s.median for t in levels]
            axes.errorbar([t.batch_size for t in levels], medians,
                          yerr=[[m - t.embeddings_per_s.low for m, t in zip(medians, levels, strict=True)],
                                [t.embeddings_per_s.high - m for m, t in zip(medians, levels, strict=True)]],
                          marker="o", capsize=3, label=f"{side.name}: {side.what}")
        axes.set_xscale("log", base=2)
        axes.set_xlabel("batch size (inputs per request)")
        axes.set_ylabel("embeddings/s")
        axes.set_title(f"{self.cell} ({self.rounds} rounds, min–max)")
        axes.legend(fontsize="small", loc="upper left")
        figure.tight_layout()
        path = out_dir / THROUGHPUT_PLOT
        figure.savefig(path, dpi=100)
        plt.close(figure)
        return [path]
