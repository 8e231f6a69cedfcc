"""The validate stage: the candidate and the reference (and any baselines), one after the other on the same
device and workload, then the comparison, the gates and the report."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from builders.serve import render
from enginesmith.artefacts import ServeRecipe
from enginesmith.specs import GateSpec, WorkloadSpec
from validation.accuracy import (
    TaskScore,
    greedy_agreement,
    greedy_completions,
    lm_eval_available,
    lm_eval_task,
    task_exact_match,
)
from validation.gates import evaluate_gates
from validation.loadgen import probe_capabilities, run_level
from validation.report import Comparison, SideReport, ValidationReport
from validation.sampling import UsageSampler
from validation.server import Endpoint, external_endpoint, free_port, running_server
from validation.workloads import Prompt, build_prompts

GREEDY_AGREEMENT_PROMPTS = 32


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


@contextmanager
def _serving(side: ServerSide, logs_dir: Path, health_timeout_s: float) -> Iterator[Endpoint]:
    if side.url is not None:
        yield external_endpoint(side.url)
        return
    assert side.recipe is not None and side.root is not None
    port = free_port()
    argv, env = render(side.recipe, artefact_dir=side.root, host="127.0.0.1", port=port, model_name=side.name)
    with running_server(argv, env, port=port, log_path=logs_dir / f"{side.role}.log", name=side.role,
                        health_timeout_s=health_timeout_s) as endpoint:
        yield endpoint


def _measure(side: ServerSide, prompts: list[Prompt], workload: WorkloadSpec, logs_dir: Path,
             tokenizer_dir: Path, health_timeout_s: float, progress: Progress) -> tuple[SideReport, list[str]]:
    requests = [(p.text, p.prompt_len, p.output_len) for p in prompts]
    task = progress.add_task(f"{side.role}: starting", total=len(requests) * len(workload.concurrency))
    with _serving(side, logs_dir, health_timeout_s) as endpoint:
        capabilities = probe_capabilities(endpoint, probe_prompt=prompts[0].text)
        levels = []
        with UsageSampler(endpoint.base_url, endpoint.pid) as sampler:
            for index, concurrency in enumerate(workload.concurrency):
                progress.update(task, description=f"{side.role}: concurrency {concurrency}")
                levels.append(run_level(
                    endpoint, requests, concurrency=concurrency, capabilities=capabilities,
                    request_rate=workload.request_rate, burstiness=workload.burstiness,
                    warmup_requests=workload.warmup_requests if index == 0 else 0,
                    on_done=lambda: progress.advance(task)))
        progress.update(task, description=f"{side.role}: accuracy")
        accuracy: list[TaskScore] = []
        for task_name in workload.accuracy_tasks:
            accuracy.append(task_exact_match(endpoint, task_name)[0])
            if lm_eval_available():
                accuracy.append(lm_eval_task(endpoint, task_name, tokenizer_dir))
        completions = greedy_completions(endpoint, [p.text for p in prompts[:GREEDY_AGREEMENT_PROMPTS]],
                                         workload.greedy_agreement_tokens)
        progress.update(task, description=f"{side.role}: done")
    at_c1 = next((level for level in levels if level.concurrency == 1), None)
    report = SideReport(
        role=side.role, name=side.name, runtime=side.runtime, levels=levels,
        tpot_c1_median_ms=at_c1.median_tpot_ms if at_c1 else None,
        max_output_throughput=max(level.output_throughput for level in levels),
        peak_memory_bytes=sampler.peak_memory_bytes, memory_source=sampler.memory_source,
        kv_cache_usage_max=sampler.kv_cache_usage_max, accuracy=accuracy, capabilities=capabilities,
        log_path=str(endpoint.log_path) if endpoint.log_path else None,
    )
    return report, completions


class _CachedReference(BaseModel):
    report: SideReport
    completions: list[str]


def _read_cached(path: Path) -> tuple[SideReport, list[str]] | None:
    if not path.is_file():
        return None
    cached = _CachedReference.model_validate_json(path.read_text())
    return cached.report, cached.completions


def _write_cached(path: Path, report: SideReport, completions: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(_CachedReference(report=report, completions=completions).model_dump_json())
    partial.replace(path)


def _ratio(candidate: float | None, reference: float | None) -> float | None:
    return candidate / reference if candidate is not None and reference else None


def validate(candidate: ServerSide, reference: ServerSide, *, workload: WorkloadSpec, gates: GateSpec,
             recipe_id: str, target_id: str, tokenizer_dir: Path, out_dir: Path,
             baselines: list[ServerSide] | None = None, health_timeout_s: float = 600,
             reference_cache: Path | None = None) -> ValidationReport:
    """Measure every side on the same prompts, compare, and apply the gates.

    ``reference_cache`` is a file keyed by the caller on (reference checkpoint, runtime, workload): the
    reference is measured once and reused by every candidate of the same model on the same target.
    """
    prompts = build_prompts(workload, tokenizer_dir)
    logs_dir = out_dir / "logs"
    sides = [candidate, reference, *(baselines or [])]
    reports, completions = [], []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=False) as progress:
        for side in sides:
            cached = _read_cached(reference_cache) if side is reference and reference_cache else None
            if cached is not None:
                side_report, side_completions = cached
            else:
                side_report, side_completions = _measure(side, prompts, workload, logs_dir, tokenizer_dir,
                                                         health_timeout_s, progress)
                if side is reference and reference_cache:
                    _write_cached(reference_cache, side_report, side_completions)
            reports.append(side_report)
            completions.append(side_completions)
    cand, ref = reports[0], reports[1]
    unobservable = [f"{r.role}: {r.level_c1.all_at_once_requests} of {r.level_c1.completed} requests got all "
                    "their tokens at once" for r in (cand, ref) if r.level_c1 is not None and not r.tpot_c1_observable]
    comparison = Comparison(
        candidate=cand, reference=ref, baselines=reports[2:],
        throughput_ratio=_ratio(cand.max_output_throughput, ref.max_output_throughput),
        tpot_ratio=_ratio(cand.tpot_c1_median_ms, ref.tpot_c1_median_ms) if not unobservable else None,
        e2el_ratio=_ratio(cand.e2el_c1_median_ms, ref.e2el_c1_median_ms),
        memory_ratio=_ratio(cand.peak_memory_bytes, ref.peak_memory_bytes),
        greedy_agreement=greedy_agreement(completions[0], completions[1]),
        greedy_agreement_tokens=workload.greedy_agreement_tokens,
    )
    drops = {f"{c.task}/{c.source}": 100 * (r.value - c.value)
             for c, r in zip(cand.accuracy, ref.accuracy, strict=True)}
    gate_results = evaluate_gates(gates, recipe_id, throughput_ratio=comparison.throughput_ratio,
                                  tpot_ratio=comparison.tpot_ratio, accuracy_drops_points=drops,
                                  failed_requests=cand.failed_requests + ref.failed_requests,
                                  e2el_ratio=comparison.e2el_ratio,
                                  tpot_unobservable="; ".join(unobservable) or None)
    notes = [note for side in sides for note in side.notes]
    for side_report in reports:
        if not side_report.capabilities.vllm_extensions:
            notes.append(f"{side_report.role} rejects vLLM's request extensions ({side_report.capabilities.detail}): "
                         "output lengths were not forced (no ignore_eos).")
        if not side_report.capabilities.prompt_logprobs:
            notes.append(f"{side_report.role} returns no prompt logprobs: generation tasks only.")
    if not lm_eval_available():
        notes.append("lm-evaluation-harness is not installed here: accuracy is our exact match over the API "
                     "(pip install 'enginesmith[validation]' for lm-eval's local-completions run).")
    return ValidationReport(
        recipe=recipe_id, target=target_id, workload=workload, comparison=comparison, gates=gate_results,
        passed=all(g.passed for g in gate_results), notes=notes,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )
