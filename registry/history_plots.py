"""A cell's history as PNG plots: one per metric, over the builds' dates, and for a swept cell one of its serving
profiles' throughput per concurrency (matplotlib, imported here only).

Each point is one build: its median with bars from the lowest to the highest round. A build whose gates failed
is drawn as a red cross, one that passed as a green dot, one never validated as a grey dot; a build that
regressed on the metric is ringed in orange. A build whose ``recorded`` is not a timestamp has no place on the
time axis and is left out (the title counts it). Files are named by ``registry.names.safe_file_name``.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from registry.history import FRONTIER_THROUGHPUT, HIGHER_IS_BETTER, BuildEntry, CellHistory
from registry.manifest import parse_timestamp
from registry.names import safe_file_name

_LABELS = {"throughput_ratio": "throughput ratio (candidate ÷ reference)",
           "tpot_ratio": "TPOT ratio (candidate ÷ reference)",
           "e2el_ratio": "E2EL ratio at c=1 (candidate ÷ reference)"}


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
        measured = [(build, point) for build in history.builds if (point := _point(build, metric)) is not None]
        shown = [(float(date2num(moment)), build, point) for build, point in measured
                 if (moment := _moment(build)) is not None]
        undated = len(measured) - len(shown)
        figure, axes = plt.subplots(figsize=(7, 4))
        axes.plot([date for date, _, _ in shown], [point[0] for _, _, point in shown], color="lightgrey", zorder=1)
        for date, build, (median, low, high) in shown:
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
        if len({date for date, _, _ in shown}) == 1:  # one night: a day either side, not matplotlib's years
            axes.set_xlim(shown[0][0] - 1, shown[0][0] + 1)
        axes.set_xlabel("build (UTC)")
        axes.set_ylabel(_LABELS.get(metric, metric.replace("accuracy:", "accuracy on ")))
        builds = f"{len(shown)} build" + ("" if len(shown) == 1 else "s")
        if undated:
            builds += f", {undated} left out: no valid date"
        axes.set_title(f"{history.cell} ({builds}; bars: min–max over rounds)", fontsize=9)
        figure.autofmt_xdate()
        figure.tight_layout()
        paths.append(out_dir / f"{safe_file_name(metric)}.png")
        figure.savefig(paths[-1], dpi=100)
        plt.close(figure)
    frontier = sorted({name for build in history.builds for name in build.outcome.frontier
                       if name.endswith(FRONTIER_THROUGHPUT)})
    if frontier:
        paths.append(_plot_frontier_history(history, frontier, out_dir / FRONTIER_HISTORY_PLOT))
    return paths


FRONTIER_HISTORY_PLOT = "frontier-history.png"


def _plot_frontier_history(history: CellHistory, metrics: list[str], path: Path) -> Path:
    """Each serving profile's output throughput at each concurrency over the builds: a line per profile and level,
    medians with bars from the lowest to the highest round; a build that regressed on one is ringed."""
    import matplotlib.pyplot as plt
    from matplotlib.dates import date2num

    figure, axes = plt.subplots(figsize=(7, 4))
    for metric in metrics:
        shown = [(float(date2num(moment)), build, spread) for build in history.builds
                 if (spread := build.outcome.frontier.get(metric)) is not None and (moment := _moment(build))]
        if not shown:
            continue
        medians = [spread.median for _, _, spread in shown]
        axes.errorbar([date for date, _, _ in shown], medians,
                      yerr=[[m - min(s.values) for m, (_, _, s) in zip(medians, shown, strict=True)],
                            [max(s.values) - m for m, (_, _, s) in zip(medians, shown, strict=True)]],
                      marker="o", capsize=3, label=metric.removesuffix(f" {FRONTIER_THROUGHPUT}"))
        for date, build, spread in shown:
            if any(r.metric == f"frontier {metric}" for r in build.regressions):
                axes.scatter([date], [spread.median], s=220, facecolors="none", edgecolors="tab:orange",
                             linewidths=2, zorder=3)
    axes.xaxis_date()
    axes.set_xlabel("build (UTC)")
    axes.set_ylabel("output tokens/s")
    axes.legend(fontsize=7)
    axes.set_title(f"{history.cell}: serving profiles over the builds (bars: min–max over rounds)", fontsize=9)
    figure.autofmt_xdate()
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def _moment(build: BuildEntry) -> datetime | None:
    """When ``build`` was recorded; ``None`` when its ``recorded`` is not a timestamp."""
    try:
        return parse_timestamp(build.outcome.recorded)
    except ValueError:
        return None


def _point(build: BuildEntry, metric: str) -> tuple[float, float, float] | None:
    """(median, low, high) of ``metric`` in ``build``; a task score is one value."""
    if metric.startswith("accuracy:"):
        score = build.outcome.accuracy.get(metric.removeprefix("accuracy:"))
        return None if score is None else (score, score, score)
    spread = build.outcome.metrics.get(metric)
    if spread is None:
        return None
    return spread.median, min(spread.values), max(spread.values)
