"""Views shared by the commands: a validation report as rich tables."""

from __future__ import annotations

from typing import TYPE_CHECKING

from enginesmith.core.console import stdout, styled, table

if TYPE_CHECKING:
    from enginesmith.core.reports import KindReport


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
