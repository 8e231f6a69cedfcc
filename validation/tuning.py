"""The tuning stage (#33): once a cell has passed its gates, its artefact is served with each point of the config's
sweep (the candidate's serve command with the point's flags) and every point measured as validation measures: a
warm-up at each level, at least the minimum duration and requests, in interleaved rounds (the points take turns
level by level, the order alternating), each level's spread over the rounds kept. What comes out is one serving
profile per point (``enginesmith.core.reports.profiles``), published in the validation report.

Where the servers can stay up together (the cpu target: they take turns on the candidate's cores) they do; on a GPU
node, where each point needs the candidate's GPUs, each point's server is started for its turn in every round.
A round that would run past the section's time budget is not started; the profiles say how many rounds they had.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from enginesmith.core.artefacts import ServeRecipe, with_flags
from enginesmith.core.console import stderr
from enginesmith.core.reports.profiles import ServingProfile, profile_from_levels
from enginesmith.core.specs import WorkloadSpec
from enginesmith.core.tuning import TuningPoint
from validation.stage import Servers, ServerSide, SideAccuracy, SideRun, measure_turn, turns
from validation.workloads import build_prompts


@dataclass(frozen=True)
class Sweep:
    """What the tuning stage measures: the points, the levels and the minimums, the rounds and the time budget."""

    points: list[TuningPoint]
    concurrency: list[int]
    rounds: int
    min_duration_s: float
    min_requests: int
    budget_s: float
    warmup_max_s: float | None = None  # None: the workload's


@dataclass(frozen=True)
class SweepResult:
    profiles: list[ServingProfile]
    rounds: int  # measured; fewer than asked where the budget ran out
    seconds: float
    notes: list[str]


def measure_profiles(sweep: Sweep, candidate: ServeRecipe, artefact_dir: Path, *, name: str, workload: WorkloadSpec,
                     tokenizer_dir: Path, out_dir: Path, target_id: str, gpus: int = 0,
                     env: dict[str, str] | None = None, keep_servers_up: bool = True,
                     health_timeout_s: float = 600, memory_bytes: int = 0) -> SweepResult:
    """Serve ``artefact_dir`` with each point of ``sweep`` (``candidate`` with the point's flags) and measure every
    point in interleaved rounds at the sweep's levels; one profile per point."""
    measured = workload.model_copy(update={"min_duration_s": sweep.min_duration_s, "min_requests": sweep.min_requests,
                                           "warmup_max_s": sweep.warmup_max_s or workload.warmup_max_s})
    prompts = build_prompts(measured, tokenizer_dir)
    requests = [(p.text, p.prompt_len, p.output_len) for p in prompts]
    prompt_texts = [p.text for p in prompts]
    sides = [ServerSide(role=point.name, name=name, runtime=candidate.runtime, root=artefact_dir,
                        recipe=candidate.model_copy(update={"argv": with_flags(candidate.argv, point.args)}),
                        env=dict(env or {}), gpus=gpus, memory_bytes=memory_bytes) for point in sweep.points]
    runs = [SideRun(side, results=SideAccuracy(accuracy=[], completions=[])) for side in sides]  # speed only
    run_id = time.strftime("%H%M%S") + "-tune"
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    started = time.perf_counter()
    notes: list[str] = []
    rounds = 0
    with ExitStack() as stack, Progress(*columns, transient=False, console=stderr) as progress:
        servers = Servers(stack, sides, out_dir / "logs", health_timeout_s, keep_servers_up)
        tasks = {run.side.role: progress.add_task(f"{run.side.role}: waiting", total=None) for run in runs}
        measuring_started = time.perf_counter()
        while rounds < sweep.rounds:
            spent_s = time.perf_counter() - measuring_started
            per_round_s = spent_s / rounds if rounds else 0.0
            if rounds and spent_s + per_round_s > sweep.budget_s:
                notes.append(f"the sweep stopped after {rounds} of {sweep.rounds} rounds: another round (about "
                             f"{per_round_s:.0f} s) would have run past its budget of {sweep.budget_s:g} s")
                break
            for run, concurrencies in turns(runs, sweep.concurrency, rounds, per_level=bool(servers.kept)):
                measure_turn(run, concurrencies, rounds, servers, measured, requests, prompts=prompt_texts,
                              tokenizer_dir=tokenizer_dir, progress=progress, task=tasks[run.side.role],
                              run_id=run_id)
            rounds += 1
    profiles = [profile_from_levels(point.name, runtime=candidate.runtime, levels=run.levels, target=target_id,
                                    gpus=gpus, knobs=point.knobs, args=point.args)
                for point, run in zip(sweep.points, runs, strict=True)]
    return SweepResult(profiles=profiles, rounds=rounds, seconds=round(time.perf_counter() - started, 1),
                       notes=notes)
