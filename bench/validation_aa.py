"""A/A benchmark: the same model served twice with the same flags, as candidate and as reference, through
validation's own code path (interleaved rounds, warm-up, minimum durations, noise-aware gates).

Every ratio should read 1.00; how far it strays is the harness's error on this machine. The last line printed is
one JSON object: {"throughput_ratio", "tpot_ratio", "e2el_ratio", "spread", "rounds", "verdict"}.

The default model is SmolLM2-135M-Instruct (fetched and converted on first use, ``enginesmith models fetch``):
a real model whose decode is engine work. ``--model tiny`` runs the 1.7 MB tiny Llama instead: its decode steps
are so short that each request is mostly HTTP and Python scheduling, so where each server's API process runs
matters as much as its model threads. ``--placement`` picks how the two servers share the node's cores (default:
as the nightly places a cpu cell, counterbalanced); the others are there to measure what each part of that
placement does.

``--slowed`` is the other half of the proof: the candidate is the same model started with ``--max-num-seqs 1`` (at
concurrency 4 it serves one request at a time), judged as the nightly judges SmolLM2 cells (its rounds, its
sequential test and its gates: throughput ≥ 0.7, latency ≤ 1.4); it must fail, and the JSON says whether it did and
after how many rounds.

Usage: python bench/validation_aa.py [--model smollm2|tiny|DIR] [--repeats 4] [--min-duration 5] [--tolerance 0.05]
                                     [--placement counterbalanced|pinned|halves|swapped|shared] [--slowed]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

from model_choice import bench_model  # bench/, this script's own directory


def main() -> None:
    from enginesmith.core.console import stdout
    from enginesmith.core.reports import gate_rows
    from enginesmith.core.reports.llm import comparison_rows
    from enginesmith.core.reports.measures import fmt_ratio
    from enginesmith.core.serving import reference_recipe
    from enginesmith.core.specs import BuildProfile, GateSpec, WorkloadSpec
    from validation.placement import CPU_BIND_ENV, place_sides
    from validation.stage import ServerSide, seat, validate

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2 (default), tiny, or a checkpoint directory")
    # An even number of rounds: each side goes first at each level equally often. With 3 rounds the candidate led
    # at c=1 twice, and its TPOT ratio read 0.973, 0.977, 0.920, 0.951 in four runs (never above 1).
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--max-repeats", type=int, default=6)
    parser.add_argument("--min-duration", type=float, default=5.0, help="seconds per level and round")
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--tolerance", type=float, default=0.05, help="the A/A target: every ratio within 1 ± this")
    parser.add_argument("--placement", choices=["counterbalanced", "pinned", "halves", "swapped", "shared"],
                        default="counterbalanced",
                        help="counterbalanced: as the nightly places a cpu cell (each side's whole server on half the "
                             "cores, the halves exchanged every round); pinned: each whole server kept on its half; "
                             "halves: only the model threads bound (vLLM's own VLLM_CPU_OMP_THREADS_BIND), the "
                             "candidate's to the first half, the API servers free; swapped: as halves, the other way "
                             "round (a placement bias flips its ratio); shared: no binding of ours (vLLM's 'auto')")
    parser.add_argument("--slowed", action="store_true",
                        help="candidate with --max-num-seqs 1, judged by the SmolLM2 config's rounds and gates")
    args = parser.parse_args()

    model_dir = bench_model(args.model)
    workload = WorkloadSpec(name="aa", dataset="random", input_len=args.input_len, output_len=args.output_len,
                            num_prompts=64, concurrency=[1, 4], warmup_requests=8, warmup_max_s=10,
                            min_duration_s=args.min_duration, min_requests=32, repeats=args.repeats,
                            max_repeats=args.max_repeats, greedy_agreement_tokens=8)
    # Gates at the A/A target: a ratio whose bounds hold its limit makes validation measure more rounds.
    gates = GateSpec(min_throughput_ratio=1 - args.tolerance, max_tpot_ratio=1 + args.tolerance)
    recipe = reference_recipe(model_dir, on_cpu=True, profile=BuildProfile(max_batch_size=16))
    candidate_recipe = recipe
    if args.slowed:
        from enginesmith.core.config import load_pipeline_config

        shipped = load_pipeline_config(Path(__file__).resolve().parents[1] / "configs" / "examples" /
                                       "smollm2-cpu.yaml")
        workload = workload.model_copy(update={key: getattr(shipped.workload, key) for key in (
            "repeats", "max_repeats", "error_budget", "round_noise")})
        gates = GateSpec(min_throughput_ratio=shipped.gates.min_throughput_ratio,
                         max_tpot_ratio=shipped.gates.max_tpot_ratio)
        candidate_recipe = reference_recipe(model_dir, on_cpu=True, profile=BuildProfile(max_batch_size=1))
    sides = [ServerSide(role="candidate", name=model_dir.name, runtime="vllm-cpu", recipe=candidate_recipe,
                        root=model_dir),
             ServerSide(role="reference", name=model_dir.name, runtime="vllm-cpu", recipe=recipe, root=model_dir)]
    # Placed on the node's cores as the nightly places a cpu cell's sides (pipeline.kinds.llm_steps.validate).
    placement = place_sides(on_cpu=True, visible_uuids=[], candidate_gpus=1, reference_gpus=1,
                            cpu_cores=sorted(os.sched_getaffinity(0)), cpu_bind=os.environ.get(CPU_BIND_ENV))
    if args.placement in ("halves", "swapped") and placement.halves is not None:
        candidate, reference = placement.halves if args.placement == "halves" else placement.halves[::-1]
        placement = replace(placement, halves=None, candidate_env={CPU_BIND_ENV: ",".join(map(str, candidate))},
                            reference_env={CPU_BIND_ENV: ",".join(map(str, reference))})
    elif args.placement == "shared":
        placement = replace(placement, halves=None, candidate_env={}, reference_env={})
    seat(placement, sides[0], sides[1])
    if args.placement == "pinned":  # each side's tree confined to its first-round half in every round
        for side in sides:
            side.cores_by_round = side.cores_by_round[:1]
    with tempfile.TemporaryDirectory(prefix="validation-aa-") as out:
        report = validate(sides[0], sides[1], workload=workload, gates=gates, recipe_id="bf16", target_id="cpu",
                          tokenizer_dir=model_dir, out_dir=Path(out))
    comparison = report.comparison
    from enginesmith.core.console import table

    stdout.print(table(f"A/A on {model_dir.name}: {comparison.rounds} interleaved rounds",
                       ["metric", *report.side_names(), "candidate / reference"], comparison_rows(report)))
    stdout.print(table("gates at the A/A target", ["gate", "measured", "spread", "limit", "verdict", "decided",
                                                   "what"], gate_rows(report.gates)))
    latency = comparison.tpot_ratios or comparison.e2el_ratios
    latency_name = "tpot_ratio" if comparison.tpot_ratios else "e2el_ratio"
    off = [f"{name} {fmt_ratio(spread)}" for name, spread in (("throughput_ratio", comparison.throughput_ratios),
                                                             (latency_name, latency))
           if spread is None or abs(spread.median - 1) > args.tolerance]
    verdict = (f"A/A holds: throughput and {latency_name} within 1.00 ± {args.tolerance:g}" if not off
               else "A/A off: " + ", ".join(off))
    if args.slowed:
        throughput_gate = next(g for g in report.gates if g.name == "min_throughput_ratio")
        verdict = (f"slowed candidate {'fails' if not report.passed else 'PASSED'}: throughput gate "
                   f"{'pass' if throughput_gate.passed else 'fail'} ({throughput_gate.decided_by})")
    print(json.dumps({
        "throughput_ratio": comparison.throughput_ratio, "tpot_ratio": comparison.tpot_ratio,
        "e2el_ratio": comparison.e2el_ratio,
        "spread": {name: spread.relative_half_range if spread else None
                   for name, spread in (("throughput", comparison.throughput_ratios), ("tpot", comparison.tpot_ratios),
                                        ("e2el", comparison.e2el_ratios))},
        "rounds": comparison.rounds, "passed": report.passed, "verdict": verdict,
    }))


if __name__ == "__main__":
    main()
