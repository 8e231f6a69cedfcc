"""Named workloads for `enginesmith validate --workload NAME` when no config gives one."""

from __future__ import annotations

from enginesmith.errors import UserError
from enginesmith.specs import WorkloadSpec

PRESETS: dict[str, WorkloadSpec] = {
    # The tiny model on a CPU: its own task's prompts, short outputs, a small concurrency sweep.
    "tiny-addition": WorkloadSpec(name="tiny-addition", dataset="task", input_len=16, output_len=8, num_prompts=32,
                                  concurrency=[1, 4], warmup_requests=2, accuracy_tasks=["addition"],
                                  greedy_agreement_tokens=8),
    # The field's comparison on a GPU (shared/reference/validation.md §7).
    "random-1k": WorkloadSpec(name="random-1k", dataset="random", input_len=1000, output_len=1000, num_prompts=512,
                              concurrency=[1, 8, 64, 256], warmup_requests=4),
}


def preset(name: str) -> WorkloadSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"unknown workload {name!r}", where="--workload",
                        hint=f"presets: {', '.join(PRESETS)}; or give --config with a workload") from None
