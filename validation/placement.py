"""Where the sides' servers run while they are measured in interleaved rounds. Pure.

On the cpu target every side stays up for the whole run and they take turns under load. On a GPU node the
sides stay up only where each gets GPUs of its own (candidate on the first ``tp × pp`` visible GPUs, the
reference on the next, each named to its server by UUID, which means the same device whatever the worker's own
``CUDA_VISIBLE_DEVICES`` is, where an index would not); otherwise two servers that each pre-allocate most of a
GPU cannot coexist, so each side's server is started for its turn in each round and stopped after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Placement:
    keep_servers_up: bool
    candidate_env: dict[str, str] = field(default_factory=dict)
    reference_env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def place_sides(*, on_cpu: bool, visible_uuids: list[str], candidate_gpus: int, reference_gpus: int) -> Placement:
    """``visible_uuids``: the UUIDs of the devices this process sees, in CUDA's order; each side's GPU count (the
    reference may need more than the candidate: BF16 weights)."""
    if on_cpu:
        return Placement(keep_servers_up=True)
    needed = candidate_gpus + reference_gpus
    if len(visible_uuids) >= needed:
        candidate = visible_uuids[:candidate_gpus]
        reference = visible_uuids[candidate_gpus:needed]
        return Placement(keep_servers_up=True, candidate_env={"CUDA_VISIBLE_DEVICES": ",".join(candidate)},
                         reference_env={"CUDA_VISIBLE_DEVICES": ",".join(reference)},
                         notes=[f"candidate on {', '.join(candidate)}, reference on {', '.join(reference)} (same "
                                "SKU), both up for the whole run, measured in turn"])
    return Placement(keep_servers_up=False, notes=[
        f"{len(visible_uuids)} GPU(s) visible, {needed} needed to keep both servers up: each side's server was "
        "started for its turn in every round"])
