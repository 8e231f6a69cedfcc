"""One typed schema for every validation report, whatever kind of cell wrote it.

Validation writes a report; the registry stores it in the manifest as JSON; history, the catalogue, the resolver
and ``enginesmith report`` read it back through ``parse_report``. Each cell kind registers its report model
under the ``kind`` its reports carry (``register_report``); every model answers the same questions
(``KindReport``), so no reader branches on a kind. Plain pydantic: no numpy, aiohttp or matplotlib on import
(plots import matplotlib when drawn).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ValidationError

from enginesmith.core.plugins import load_env_plugins
from enginesmith.core.reports.measures import GateResult, Spread

if TYPE_CHECKING:
    from enginesmith.core.reports.profiles import ServingProfile

Objective = Literal["throughput", "latency"]
# Reports written before they carried a kind are LLM reports.
DEFAULT_REPORT_KIND = "llm"


class TableView(BaseModel):
    caption: str
    columns: list[str]
    rows: list[list[str]]
    verdict_column: int | None = None  # cells of this column are styled pass/fail


class ReportView(BaseModel):
    """A validation report as a page shows it: a summary, tables and notes."""

    kind: str  # the report's kind, or "none" (no report) or "unreadable"
    title: str = ""
    problem: str = ""  # why the report could not be read (kind "unreadable")
    passed: bool | None = None
    summary: str = ""
    tables: list[TableView] = []
    notes: list[str] = []
    throughput_ratio: str = "—"
    tpot_ratio: str = "—"
    # Where the speed ratios should read 1.00 and did not, or could not be judged: the line that says so ("" where
    # they did, or where they compare real speeds).
    calibration_fault: str = ""


class KindReport(Protocol):
    """What every kind's report model answers."""

    @property
    def kind(self) -> str: ...

    @property
    def cell(self) -> str | None:
        """The plan's id of the cell validated (None: an ad-hoc validation, or a report from before they named it)."""
        ...

    @property
    def passed(self) -> bool: ...

    @property
    def gates(self) -> list[GateResult]: ...

    def round_metrics(self) -> dict[str, Spread]:
        """Candidate ÷ reference ratios measured once per round, by the names history tracks them under."""
        ...

    def accuracy(self) -> dict[str, float]:
        """The candidate's accuracy measures (task scores, cosine, recall), by name."""
        ...

    def objective_spread(self, objective: Objective) -> Spread | None:
        """What the resolver ranks by, one value per round: the candidate's throughput (higher is better) or latency
        (lower); two artefacts whose spreads overlap are a tie on it. None where the kind measures no speed."""
        ...

    def speed_checks_harness(self) -> bool:
        """Did its candidate and reference run the same kernels (the cpu target), so its speed checks the harness
        and says nothing of the artefact? The resolver then ranks by accuracy."""
        ...

    def serving_profiles(self) -> list[ServingProfile]:
        """The serving settings it was measured with and what each gave (``enginesmith.core.reports.profiles``); empty
        where the kind has none."""
        ...

    def view(self) -> ReportView: ...

    def markdown(self) -> str: ...

    def plots(self, out_dir: Path) -> list[Path]:
        """Draw the report's plots into ``out_dir`` (needs matplotlib); the files written."""
        ...


REPORT_KINDS: dict[str, type[BaseModel]] = {}


def register_report(kind: str, model: type[BaseModel]) -> None:
    """Read reports whose ``kind`` is ``kind`` as ``model`` (which must answer ``KindReport``)."""
    REPORT_KINDS[kind] = model


def report_kind_of(validation: Mapping[str, Any]) -> str:
    kind = validation.get("kind", DEFAULT_REPORT_KIND)
    return kind if isinstance(kind, str) else repr(kind)


def parse_report(validation: Mapping[str, Any] | None) -> KindReport | str | None:
    """A stored report as its kind's model; a sentence saying why when it is not one; None when there is none."""
    if validation is None:
        return None
    kind = report_kind_of(validation)
    if kind not in REPORT_KINDS:
        load_env_plugins()  # a plug-in kind's reports are read where its module is named
    model = REPORT_KINDS.get(kind)
    if model is None:
        return (f"a report of kind {kind!r}, which nothing here reads (kinds read: {', '.join(sorted(REPORT_KINDS))}); "
                "name the module that registers it in ENGINESMITH_PLUGINS")
    try:
        parsed: KindReport = model.model_validate(validation)  # type: ignore[assignment]
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "(top level)"
        return f"not a {kind} report: {field}: {first['msg']} ({exc.error_count()} problem(s))"
    return parsed


def serving_profiles_of(report: KindReport | str | None) -> list[ServingProfile]:
    """A parsed report's serving profiles; none for no report, an unreadable one, or a plug-in kind's report
    written before the protocol asked for them."""
    if report is None or isinstance(report, str):
        return []
    profiles = getattr(report, "serving_profiles", None)
    return list(profiles()) if callable(profiles) else []


def gate_table(gates: list[GateResult], measured_spec: str = ".3f") -> TableView:
    """The gates as every report shows them."""
    return TableView(caption="Gates", columns=GATE_COLUMNS, rows=gate_rows(gates, measured_spec), verdict_column=4)


GATE_COLUMNS = ["gate", "measured", "rounds' spread", "limit", "verdict", "decided", "what is measured"]


def gate_rows(gates: list[GateResult], measured_spec: str = ".3f") -> list[list[str]]:
    """gate, measured (the median), spread over rounds, limit, verdict, how it was decided, what is measured."""
    return [[g.name, "—" if g.measured is None else format(g.measured, measured_spec), g.spread_label, f"{g.limit:g}",
             g.verdict, g.decided_by, g.detail] for g in gates]


def view_markdown(title: str, view: ReportView) -> str:
    """A report's markdown from its view: the title, then each table under its caption."""
    lines = [f"# {title}", ""]
    for table in view.tables:
        lines += [f"## {table.caption}", "", *markdown_table(table), ""]
    return "\n".join(lines)


def markdown_table(table: TableView) -> list[str]:
    lines = ["| " + " | ".join(table.columns) + " |", "|---" * len(table.columns) + "|"]
    for row in table.rows:
        shown = list(row)
        if table.verdict_column is not None and shown[table.verdict_column] == "FAIL":
            shown[table.verdict_column] = "**FAIL**"
        lines.append("| " + " | ".join(shown) + " |")
    return lines


def _register_builtin() -> None:
    from enginesmith.core.reports.encoder import EncoderValidationReport
    from enginesmith.core.reports.llm import ValidationReport

    register_report("llm", ValidationReport)
    register_report("encoder", EncoderValidationReport)


_register_builtin()
