"""Views shared by the commands: a validation report, the support matrix, as rich tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginesmith.core.console import Cell, stdout, styled, table

if TYPE_CHECKING:
    from enginesmith.core.reports import KindReport
    from enginesmith.core.specs import PipelineConfig
    from registry.support import SupportMatrix


# A verdict cell's style; any other word (a gate "not decided") is shown as it is, in yellow.
VERDICT_STYLES = {"pass": "green", "FAIL": "red"}


def print_validation(report: KindReport) -> None:
    """The report's tables (the comparison, the gates) as rich tables, its notes and its verdict."""
    view = report.view()
    if view.title:
        stdout.print(view.title, style="bold")
    stdout.print(view.summary)
    for shown in view.tables:
        rows = [[styled(cell, VERDICT_STYLES.get(cell, "yellow")) if index == shown.verdict_column else cell
                 for index, cell in enumerate(row)] for row in shown.rows]
        stdout.print(table(shown.caption, shown.columns, rows))
    for note in view.notes:
        stdout.print(f"note: {note}")
    stdout.print("PASSED" if report.passed else "FAILED", style="bold green" if report.passed else "bold red")


def print_support(matrix: SupportMatrix) -> None:
    """The support matrix as a table, a row per cell, and a line of counts."""
    from registry.support import cell_summary

    colours = {"validated": "green", "gate-failed": "red", "failed": "red", "refused": "yellow", "not run": "dim"}
    rows: list[list[Cell]] = [[cell.model, cell.model_type, cell.recipe, cell.kind, cell.target,
                               styled(cell_summary(cell), colours[cell.status]),
                               cell.reason[:160] if cell.status in ("refused", "failed") else ""]
                              for cell in matrix.cells]
    stdout.print(table(f"Support: {matrix.config}", ["model", "model_type", "recipe", "kind", "target", "status",
                                                     "reason"], rows))
    stdout.print(", ".join(f"{count} {status}" for status, count in matrix.counts().items()))


def print_notes(notes: list[str]) -> None:
    """Lines that qualify the table above them, each dimmed behind ``note``."""
    from rich.markup import escape

    for note in notes:
        stdout.print(f"[dim]note[/] {escape(note)}", markup=True)


def print_estimate(pipeline: PipelineConfig, cells: list[object], *, json_output: bool) -> None:
    """``enginesmith plan --estimate``: each buildable GPU cell's GPU-hours per stage on its SKU, and each pool's
    total, as tables or JSON. Cells it cannot estimate (invalid, the cpu target, a SKU without figures, a model
    without params_b, another kind's) are counted and named in the JSON."""
    from enginesmith.core.console import print_json
    from enginesmith.core.cost import STAGES, estimate_planned, pool_totals

    costs, skipped = estimate_planned(cells, pipeline)
    pools = pool_totals(costs)
    if json_output:
        print_json({"config": pipeline.name, "estimate": True,
                    "cells": [{**cost.model_dump(), "gpus": cost.gpus, "seconds": round(cost.seconds, 1),
                               "gpu_seconds": round(cost.gpu_seconds, 1)} for cost in costs],
                    "pools": [pool.model_dump() for pool in pools], "not_estimated": skipped})
        return
    rows: list[list[Cell]] = []
    for cost in costs:
        by_stage = {stage.stage: stage for stage in cost.stages}
        rows.append([cost.cell_id, cost.pool, str(cost.gpus),
                     *(f"{by_stage[name].gpu_seconds / 3600:.2f}" if name in by_stage else "-" for name in STAGES),
                     f"{cost.gpu_seconds / 3600:.2f}", f"{cost.seconds / 3600:.2f}"])
    stdout.print(table(f"Estimate: {pipeline.name} (GPU-hours per stage)",
                       ["cell", "pool", "GPUs", *STAGES, "GPU-h", "wall h"], rows))
    stdout.print(table("Per pool", ["pool", "cells", "GPU-hours", "longest cell (h)"],
                       [[pool.pool, str(pool.cells), f"{pool.gpu_seconds / 3600:.1f}",
                         f"{pool.longest_cell_s / 3600:.2f}"] for pool in pools]))
    stdout.print(f"{len(costs)} cells estimated, {len(skipped)} not (invalid, cpu or another kind); an estimate "
                 "from parameters, recipe, workload and each SKU's spec sheet (enginesmith/core/cost.py), not a "
                 "measurement")
