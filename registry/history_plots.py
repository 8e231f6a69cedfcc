"""A cell's history as PNG plots: one per metric, over the builds' dates (matplotlib, imported here only).

Each point is one build: its median with bars from the lowest to the highest round. A build whose gates failed
is drawn as a red cross, one that passed as a green dot, one never validated as a grey dot; a build that
regressed on the metric is ringed in orange.
"""

from __future__ import annotations

import re
from pathlib import Path

from registry.history import HIGHER_IS_BETTER, BuildEntry, CellHistory
from registry.manifest import parse_timestamp

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_LABELS = {"throughput_ratio": "throughput ratio (candidate ÷ reference)",
           "tpot_ratio": "TPOT ratio (candidate ÷ reference)"}


def safe_file_stem(name: str) -> str:
    """``name`` as one safe file name component (metric names hold ':' and '@', cell ids '/')."""
    return _UNSAFE.sub("_", name).strip("._") or "metric"


def cell_slug(cell: str) -> str:
    """A cell id (``model/recipe/target/tp1/kind``) as a directory name."""
    return safe_file_stem(cell.replace("/", "__"))


def plotted_metrics(history: CellHistory) -> list[str]:
    """The metrics some build of the cell measured: the ``HIGHER_IS_BETTER`` ones, then ``accuracy:<task>``."""
    measured = {name for build in history.builds for name in build.outcome.metrics}
    tasks = sorted({task for build in history.builds for task in build.outcome.accuracy})
    return [name for name in HIGHER_IS_BETTER if name in measured] + [f"accuracy:{task}" for task in tasks]


def write_history_plots(history: CellHistory, out_dir: Path) -> list[Path]:
    """One PNG per metric of ``history`` under ``out_dir`` (created), named after the metric; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.dates import date2num

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for metric in plotted_metrics(history):
        points = [(build, _point(build, metric)) for build in history.builds]
        shown = [(build, point) for build, point in points if point is not None]
        figure, axes = plt.subplots(figsize=(7, 4))
        dates = [float(date2num(parse_timestamp(build.outcome.recorded))) for build, _ in shown]
        medians = [point[0] for _, point in shown]
        axes.plot(dates, medians, color="lightgrey", zorder=1)
        for date, (build, (median, low, high)) in zip(dates, shown, strict=True):
            verdict = build.outcome.passed
            colour, marker = {True: ("tab:green", "o"), False: ("tab:red", "X"), None: ("grey", "o")}[verdict]
            axes.errorbar([date], [median], yerr=[[median - low], [high - median]], fmt=marker, color=colour,
                          capsize=3, zorder=2)
            if any(r.metric == metric for r in build.regressions):
                axes.scatter([date], [median], s=220, facecolors="none", edgecolors="tab:orange", linewidths=2,
                             zorder=3)
            if build.channels:
                axes.annotate(", ".join(build.channels), (date, median), textcoords="offset points",
                              xytext=(0, 8), ha="center", fontsize=8)
        axes.xaxis_date()
        axes.set_xlabel("build (UTC)")
        axes.set_ylabel(_LABELS.get(metric, metric))
        builds = f"{len(shown)} build" + ("" if len(shown) == 1 else "s")
        axes.set_title(f"{history.cell} ({builds}; bars: min–max over rounds)", fontsize=9)
        figure.autofmt_xdate()
        figure.tight_layout()
        paths.append(out_dir / f"{safe_file_stem(metric)}.png")
        figure.savefig(paths[-1], dpi=100)
        plt.close(figure)
    return paths


def _point(build: BuildEntry, metric: str) -> tuple[float, float, float] | None:
    """(median, low, high) of ``metric`` in ``build``; a task score is one value."""
    if metric.startswith("accuracy:"):
        score = build.outcome.accuracy.get(metric.removeprefix("accuracy:"))
        return None if score is None else (score, score, score)
    spread = build.outcome.metrics.get(metric)
    if spread is None:
        return None
    return spread.median, min(spread.values), max(spread.values)
