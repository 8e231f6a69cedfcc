"""Views shared by the commands: a validation report, the support matrix, as rich tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginesmith.core.console import Cell, stdout, styled, table

if TYPE_CHECKING:
    from enginesmith.core.reports import KindReport
    from registry.support import SupportMatrix


def print_validation(report: KindReport) -> None:
    """The report's tables (the comparison, the gates) as rich tables, its notes and its verdict."""
    view = report.view()
    if view.title:
        stdout.print(view.title, style="bold")
    stdout.print(view.summary)
    for shown in view.tables:
        rows = [[(styled("pass", "green") if cell == "pass" else styled("FAIL", "red")) if index == shown.verdict_column
                 else cell for index, cell in enumerate(row)] for row in shown.rows]
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
