"""Named workloads for `enginesmith validate --workload NAME` when no config gives one."""

from __future__ import annotations

from enginesmith.core.errors import UserError
from enginesmith.core.specs import WorkloadSpec

PRESETS: dict[str, WorkloadSpec] = {
    # The tiny model on a CPU: its own task's prompts, short outputs, a small concurrency sweep, short levels.
    "tiny-addition": WorkloadSpec(name="tiny-addition", dataset="task", input_len=16, output_len=8, num_prompts=32,
                                  concurrency=[1, 4], warmup_requests=8, warmup_max_s=5, min_duration_s=3,
                                  min_requests=32, repeats=2, max_repeats=5, round_noise=0.2,
                                  accuracy_tasks=["addition"],
                                  greedy_agreement_tokens=8),
    # The field's comparison on a GPU (1000/1000 random tokens, concurrency 1 to 256), each level at least a
    # minute and 64 requests after warm-up, interleaved rounds until the gates are decided.
    "random-1k": WorkloadSpec(name="random-1k", dataset="random", input_len=1000, output_len=1000, num_prompts=512,
                              concurrency=[1, 8, 64, 256], warmup_requests=8, min_duration_s=60, min_requests=64,
                              repeats=2, max_repeats=6),
}


def preset(name: str) -> WorkloadSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"unknown workload {name!r}", where="--workload",
                        hint=f"presets: {', '.join(PRESETS)}; or give --config with a workload") from None
