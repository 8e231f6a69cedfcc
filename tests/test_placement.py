"""Where validation's sides run: each side's GPUs or half of the cores, and on the cpu target the halves exchanged
every round on the running servers (their real process trees moved with sched_setaffinity)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from contextlib import ExitStack
from pathlib import Path

import pytest

from enginesmith.core.artefacts import ServeRecipe
from validation.affinity import moved, thread_ids
from validation.placement import place_sides, rounds_note
from validation.server import Endpoint
from validation.stage import Servers, ServerSide, SideRun, seat, seat_started_on_cpu, turns


def _uuid(n: int) -> str:
    return f"GPU-{n:08x}-1111-2222-3333-{n:012x}"


def test_validation_names_each_sides_gpus_by_uuid():
    placement = place_sides(on_cpu=False, visible_uuids=[_uuid(5), _uuid(2), _uuid(7), _uuid(1)], candidate_gpus=1,
                            reference_gpus=2)
    assert placement.keep_servers_up
    assert placement.candidate_env == {"CUDA_VISIBLE_DEVICES": _uuid(5)}
    assert placement.reference_env == {"CUDA_VISIBLE_DEVICES": f"{_uuid(2)},{_uuid(7)}"}
    assert not place_sides(on_cpu=False, visible_uuids=[_uuid(5), _uuid(2)], candidate_gpus=1,
                           reference_gpus=2).keep_servers_up


def test_on_the_cpu_the_sides_model_threads_get_disjoint_halves_of_the_node_unless_the_node_pins_them():
    split = place_sides(on_cpu=True, visible_uuids=[], candidate_gpus=1, reference_gpus=1, cpu_cores=[7, 0, 1, 2, 5])
    assert split.keep_servers_up
    assert split.candidate_env == {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    assert split.reference_env == {"VLLM_CPU_OMP_THREADS_BIND": "2,5"}  # the odd core out is left to the frontends
    two = place_sides(on_cpu=True, visible_uuids=[], candidate_gpus=1, reference_gpus=1, cpu_cores=[0, 1])
    assert (two.candidate_env, two.reference_env) == ({"VLLM_CPU_OMP_THREADS_BIND": "0"},
                                                      {"VLLM_CPU_OMP_THREADS_BIND": "1"})
    pinned = place_sides(on_cpu=True, visible_uuids=[], candidate_gpus=1, reference_gpus=1, cpu_cores=[0, 1],
                         cpu_bind="1")
    assert pinned.keep_servers_up and not pinned.candidate_env and not pinned.reference_env
    assert "VLLM_CPU_OMP_THREADS_BIND=1" in pinned.notes[0] and "not counterbalanced" in pinned.notes[0]
    assert pinned.halves is None and pinned.cores_by_round("candidate") == ()
    alone = place_sides(on_cpu=True, visible_uuids=[], candidate_gpus=1, reference_gpus=1, cpu_cores=[3])
    assert alone.keep_servers_up and not alone.candidate_env and not alone.reference_env


def test_validate_with_two_started_sides_on_the_cpu_places_them_as_a_planned_cell(monkeypatch: pytest.MonkeyPatch):
    """`validate --candidate DIR --reference DIR` on the cpu target: both servers were left to vLLM's own binding,
    which put both sides' model threads on core 0 of a 2-core node (both logs: "core ids=[0]")."""
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    recipe = ServeRecipe(runtime="vllm-cpu", argv=["{vllm_cpu_python}"])

    def started(role: str) -> ServerSide:
        return ServerSide(role=role, name="m", runtime="vllm-cpu", recipe=recipe, root=Path("/m"))

    candidate, reference = started("candidate"), started("reference")
    placement = seat_started_on_cpu(candidate, reference, on_cpu=True, cpu_cores=[0, 1])
    assert placement is not None and "exchanged every round" in placement.notes[0]
    assert (candidate.env, reference.env) == ({"VLLM_CPU_OMP_THREADS_BIND": "0"}, {"VLLM_CPU_OMP_THREADS_BIND": "1"})
    assert (candidate.cores_in(0), candidate.cores_in(1)) == ((0,), (1,))
    url = ServerSide(role="reference", name="m", runtime="external", url="http://127.0.0.1:1")
    for sides, on_cpu in (((started("candidate"), url), True), ((started("candidate"), started("reference")), False)):
        assert seat_started_on_cpu(*sides, on_cpu=on_cpu, cpu_cores=[0, 1]) is None
        assert all(not side.env and side.cores_by_round == () for side in sides)


def test_over_any_two_rounds_each_side_has_each_half_and_each_turn_once():
    placement = place_sides(on_cpu=True, visible_uuids=[], candidate_gpus=1, reference_gpus=1, cpu_cores=[0, 1, 2, 3])
    assert placement.halves == ((0, 1), (2, 3))
    candidate = ServerSide(role="candidate", name="m", runtime="vllm-cpu", url="http://127.0.0.1:1")
    reference = ServerSide(role="reference", name="m", runtime="vllm-cpu", url="http://127.0.0.1:2")
    seat(placement, candidate, reference)
    assert candidate.env == {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}  # where its server starts
    runs = [SideRun(candidate), SideRun(reference)]
    for first_round in range(4):
        pair = (first_round, first_round + 1)
        assert {candidate.cores_in(r) for r in pair} == {reference.cores_in(r) for r in pair} == {(0, 1), (2, 3)}
        assert all(set(candidate.cores_in(r)).isdisjoint(reference.cores_in(r)) for r in pair)
        # The first level's first side alternates as the halves do: each side leads once in the pair.
        assert {turns(runs, [1, 4], r, per_level=True)[0][0].side.role for r in pair} == {"candidate", "reference"}
    assert "exchanged every round" in placement.notes[0]
    note = rounds_note([{"candidate": (0, 1), "reference": (2, 3)}, {"candidate": (2, 3), "reference": (0, 1)}],
                       ["candidate", "reference"])
    assert note == ("Placement by round (cores; the first level's first side): round 1: candidate on 0-1, reference on "
                    "2-3, candidate first; round 2: candidate on 2-3, reference on 0-1, reference first.")
    gpu = place_sides(on_cpu=False, visible_uuids=[_uuid(1), _uuid(2)], candidate_gpus=1, reference_gpus=1)
    assert gpu.halves is None and "not counterbalanced" in gpu.notes[0]


def test_a_thread_keeps_its_position_in_the_half_and_a_free_thread_is_confined_to_it():
    assert moved({0}, [0, 1], [2, 3]) == {2}
    assert moved({1}, [0, 1], [2, 3]) == {3}
    assert moved({0, 1, 2, 3}, [0, 1], [2, 3]) == {2, 3}  # an API server free on the node
    assert moved({0, 1}, [0, 1], [0, 1]) == {0, 1}
    assert moved({5}, [0, 1], [2, 3]) == {2, 3}  # on none of the old cores: the whole new half


# A server double at the process boundary: a parent with a thread pinned to its first core (a model thread) and a
# free one, and a child process (vLLM's engine core beside its API server).
TREE = textwrap.dedent("""
    import os, subprocess, sys, threading
    first, pinned = int(sys.argv[1]), threading.Event()
    def model_thread():
        os.sched_setaffinity(0, {first})
        pinned.set()
        threading.Event().wait()
    threading.Thread(target=model_thread, daemon=True).start()
    pinned.wait()
    threading.Thread(target=threading.Event().wait, daemon=True).start()
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    print(child.pid, flush=True)
    sys.stdin.read()
""")


def _tree_affinities(pid: int) -> list[set[int]]:
    from validation.sampling import process_tree_pids
    return sorted((os.sched_getaffinity(tid) for p in process_tree_pids(pid) for tid in thread_ids(p)), key=sorted)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores to exchange")
def test_the_running_servers_process_trees_exchange_their_halves_every_round(tmp_path: Path):
    cores = sorted(os.sched_getaffinity(0))[:2]
    placement = place_sides(on_cpu=True, visible_uuids=[], candidate_gpus=1, reference_gpus=1, cpu_cores=cores)
    candidate = ServerSide(role="candidate", name="m", runtime="double", url="http://127.0.0.1:1")
    reference = ServerSide(role="reference", name="m", runtime="double", url="http://127.0.0.1:2")
    seat(placement, candidate, reference)
    processes = {side.role: subprocess.Popen([sys.executable, "-c", TREE, str(side.cores_in(0)[0])],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for side in (candidate, reference)}
    try:
        for process in processes.values():
            assert process.stdout is not None and process.stdout.readline().strip()  # its child has started
        with ExitStack() as stack:
            servers = Servers(stack, [candidate, reference], tmp_path, health_timeout_s=1, keep_up=False)
            for role, process in processes.items():  # as if started and kept up for the run
                servers.kept[role] = Endpoint(base_url=f"http://127.0.0.1/{role}", model="m", pid=process.pid)
            for round_index in range(3):
                servers.place_round(round_index)
                for side in (candidate, reference):
                    half = set(side.cores_in(round_index))
                    affinities = _tree_affinities(processes[side.role].pid)
                    assert len(affinities) >= 4  # two processes, the parent's three threads at least
                    assert all(affinity == half for affinity in affinities), (side.role, round_index, affinities)
        assert [placed["candidate"] for placed in servers.placed] == [(cores[0],), (cores[1],), (cores[0],)]
    finally:
        for process in processes.values():
            process.kill()
            process.wait()
