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


def place_sides(*, on_cpu: bool, visible_uuids: list[str], gpus_per_side: int) -> Placement:
    """``visible_uuids``: the UUIDs of the devices this process sees, in CUDA's order."""
    if on_cpu:
        return Placement(keep_servers_up=True)
    if len(visible_uuids) >= 2 * gpus_per_side:
        candidate = visible_uuids[:gpus_per_side]
        reference = visible_uuids[gpus_per_side:2 * gpus_per_side]
        return Placement(keep_servers_up=True, candidate_env={"CUDA_VISIBLE_DEVICES": ",".join(candidate)},
                         reference_env={"CUDA_VISIBLE_DEVICES": ",".join(reference)},
                         notes=[f"candidate on CUDA devices 0-{gpus_per_side - 1} ({', '.join(candidate)}), reference "
                                f"on {gpus_per_side}-{2 * gpus_per_side - 1} ({', '.join(reference)}) (same SKU), both "
                                "up for the whole run, measured in turn"])
    return Placement(keep_servers_up=False, notes=[
        f"{len(visible_uuids)} GPU(s) visible, {2 * gpus_per_side} needed to keep both servers up: each side's server "
        "was started for its turn in every round"])
