"""The support matrix: what the chain does for each model × recipe × kind × target, as the plan and the registry's
history say. A cell the plan refuses shows its rule and reason (where the rule names an upstream component, its
version and reason are in the message); a cell the plan builds shows how its newest run *for the planned inputs*
ended (a run under another key ran on other inputs and says nothing about these): validated with its accuracy drop,
greedy agreement with the BF16 reference and perplexity increase, gate-failed with the gates that failed, failed
with the stage's error, or not run.

Pure: the caller plans the config and reads the histories (``enginesmith support``, ``bench/conformance.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel

from registry.history import CellOutcome, ModelHistory

SupportStatus = Literal["validated", "gate-failed", "failed", "refused", "not run"]


class CellCoordinates(BaseModel):
    """Which cell: its id, model (and the checkpoint's config.json ``model_type``, "" where not read), recipe, kind,
    target and the key it was planned under."""

    cell: str
    model: str
    model_type: str = ""
    recipe: str
    kind: str
    target: str
    key: str


class PlannedFacts(CellCoordinates):
    """What the plan says of one cell (whatever its kind)."""

    buildable: bool
    rules: list[str] = []  # the refusing rules' ids
    reason: str = ""


class SupportCell(CellCoordinates):
    """One cell of the matrix, as the plan and the history say."""

    status: SupportStatus
    # validated / gate-failed: the worst accuracy drop over the tasks (points), the greedy agreement with the BF16
    # reference (share of tokens), the perplexity increase (relative); None where not measured.
    accuracy_drop_points: float | None = None
    greedy_agreement: float | None = None
    perplexity_increase: float | None = None
    # refused: the rule ids; failed / gate-failed: what stopped it.
    rules: list[str] = []
    reason: str = ""
    recorded: str = ""  # when the outcome shown was recorded


class SupportMatrix(BaseModel):
    config: str
    cells: list[SupportCell]

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for cell in self.cells:
            found[cell.status] = found.get(cell.status, 0) + 1
        return found


def support_matrix(config_name: str, cells: Iterable[PlannedFacts], histories: Mapping[str, ModelHistory]
                   ) -> SupportMatrix:
    """The matrix of ``cells`` (as planned) with each buildable cell's newest outcome under its planned key from
    ``histories`` (model id → its history)."""
    rows = []
    for cell in cells:
        base = cell.model_dump(include=set(CellCoordinates.model_fields))
        if not cell.buildable:
            rows.append(SupportCell(**base, status="refused", rules=cell.rules, reason=cell.reason))
            continue
        rows.append(_from_outcome(base, _newest_for_key(histories.get(cell.model), cell.cell, cell.key)))
    return SupportMatrix(config=config_name, cells=rows)


def _newest_for_key(history: ModelHistory | None, cell: str, key: str) -> CellOutcome | None:
    if history is None:
        return None
    for cell_history in history.cells:
        if cell_history.cell == cell:
            matching = [build.outcome for build in cell_history.builds if build.outcome.key == key]
            return matching[-1] if matching else None
    return None


def _from_outcome(base: dict[str, Any], outcome: CellOutcome | None) -> SupportCell:
    if outcome is None:
        return SupportCell(**base, status="not run")
    drops = [gate.measured for gate in outcome.gates if gate.name.startswith("accuracy_drop:")
             and gate.measured is not None]
    measured = {gate.name: gate.measured for gate in outcome.gates}
    numbers = {"accuracy_drop_points": max(drops) if drops else None,
               "greedy_agreement": measured.get("min_greedy_agreement"),
               "perplexity_increase": measured.get("max_perplexity_increase"), "recorded": outcome.recorded}
    if outcome.status == "built" and outcome.passed is not False:
        return SupportCell(**base, **numbers, status="validated")
    if outcome.status == "gate-failed":
        failed = [gate.name for gate in outcome.gates if not gate.passed]
        return SupportCell(**base, **numbers, status="gate-failed", rules=failed,
                           reason=outcome.reason or f"gates failed: {', '.join(failed)}")
    return SupportCell(**base, status="failed", reason=outcome.reason or outcome.status, recorded=outcome.recorded)


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value * 100:.1f} %"


def cell_summary(cell: SupportCell) -> str:
    """What the cell shows in one short line: the numbers where validated, the rule where refused."""
    if cell.status in ("validated", "gate-failed"):
        parts = []
        if cell.accuracy_drop_points is not None:
            parts.append(f"drop {cell.accuracy_drop_points:+.1f} pt")
        if cell.greedy_agreement is not None:
            parts.append(f"agree {_percent(cell.greedy_agreement)}")
        if cell.perplexity_increase is not None:
            parts.append(f"ppl {cell.perplexity_increase * 100:+.1f} %")
        failed = f" ({', '.join(cell.rules)})" if cell.status == "gate-failed" and cell.rules else ""
        return f"{cell.status}{failed}: {', '.join(parts)}" if parts else cell.status + failed
    if cell.status == "refused":
        return f"refused ({', '.join(cell.rules)})"
    if cell.status == "failed":
        return f"failed: {cell.reason.splitlines()[0][:80] if cell.reason else ''}"
    return cell.status


class SupportRow(BaseModel):
    """One row of the matrix as shown: a model on a kind and target, a cell per recipe (None where not planned)."""

    model: str
    model_type: str
    kind: str
    target: str
    cells: list[SupportCell | None]


def support_rows(matrix: SupportMatrix) -> tuple[list[str], list[SupportRow]]:
    """The recipes (columns, in the order planned) and a row per model, kind and target."""
    recipes = list(dict.fromkeys(cell.recipe for cell in matrix.cells))
    grouped: dict[tuple[str, str, str, str], dict[str, SupportCell]] = {}
    for cell in matrix.cells:
        grouped.setdefault((cell.model, cell.model_type, cell.kind, cell.target), {})[cell.recipe] = cell
    rows = [SupportRow(model=model, model_type=model_type, kind=kind, target=target,
                       cells=[by_recipe.get(recipe) for recipe in recipes])
            for (model, model_type, kind, target), by_recipe in grouped.items()]
    return recipes, rows


def reasons(matrix: SupportMatrix) -> list[str]:
    """Each distinct reason a cell was refused or failed, once, with the cells it applies to."""
    found: dict[str, list[str]] = {}
    for cell in matrix.cells:
        if cell.status in ("refused", "failed"):
            where = f"{cell.model} {cell.recipe} {cell.kind} {cell.target}"
            found.setdefault(" ".join(cell.reason.split()), []).append(where)
    return [f"{reason} — {len(cells)} cell{'s' if len(cells) > 1 else ''}, e.g. {cells[0]}"
            for reason, cells in found.items()]


def markdown_table(matrix: SupportMatrix) -> str:
    """The matrix as a Markdown table: a row per model, kind and target, a column per recipe; then each distinct reason
    a cell was refused or failed, once."""
    recipes, rows = support_rows(matrix)
    lines = ["| model | model_type | kind | target | " + " | ".join(recipes) + " |",
             "|---|---|---|---|" + "---|" * len(recipes)]
    for row in rows:
        shown = [cell_summary(cell) if cell is not None else "" for cell in row.cells]
        lines.append(f"| {row.model} | {row.model_type} | {row.kind} | {row.target} | " + " | ".join(shown) + " |")
    listed = reasons(matrix)
    if listed:
        lines += ["", "Refused and failed cells, each reason once:", "", *(f"- {line}" for line in listed)]
    return "\n".join(lines) + "\n"
