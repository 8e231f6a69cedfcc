"""Writing a validation report where a cell's run leaves it: JSON (what the registry manifest keeps), Markdown
(the Prefect artifact) and PNG plots. The schema and its views are the vocabulary's (``enginesmith.core.reports``)."""

from __future__ import annotations

from pathlib import Path

from enginesmith.core.reports import KindReport

REPORT_JSON, REPORT_MARKDOWN = "report.json", "report.md"


def write_report(report: KindReport, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, markdown_path = out_dir / REPORT_JSON, out_dir / REPORT_MARKDOWN
    json_path.write_text(report.model_dump_json(indent=2))  # type: ignore[attr-defined]
    markdown_path.write_text(report.markdown())
    written = {"json": json_path, "markdown": markdown_path}
    for path in report.plots(out_dir):
        written[path.stem] = path
    return written
