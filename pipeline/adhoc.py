"""Quantising and building outside a matrix (``enginesmith quantize SOURCE --recipe R``, ``enginesmith build DIR
--target T``): the stage requests, keyed by the same functions the plan keys a cell with (``enginesmith.core.plan``),
from what the command line gives and what is installed here. The CLI parses and prints; this decides."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from builders.stage import BuildRequest
from enginesmith.core.artefacts import Artefact, ExportFormat, QuantizedCheckpoint, read_artefact
from enginesmith.core.calibration import calibration_fingerprint
from enginesmith.core.checkpoints.inspect import model_shape
from enginesmith.core.checkpoints.pull import parse_source, pull_checkpoint
from enginesmith.core.config import Catalogue
from enginesmith.core.errors import UserError
from enginesmith.core.plan import Cell, build_key, builder_inputs, calibration_plan, quantize_key
from enginesmith.core.shapes import choose_awq_block_size, keyed_recipe
from enginesmith.core.specs import ARTEFACT_KINDS, BuildProfile, PipelineConfig, Toolchains, check_power_of_two
from enginesmith.core.state import DEFAULTS, WORK_ENV
from quantization.stage import QuantizeRequest, installed_versions

if TYPE_CHECKING:
    from enginesmith.core.reports.llm import ValidationReport

EXPORT_FORMATS: tuple[ExportFormat, ...] = ("hf", "trtllm", "hf-bf16")
WORK = Path(DEFAULTS[WORK_ENV])


def export_formats(formats: str) -> list[ExportFormat]:
    chosen = [f.strip() for f in formats.split(",") if f.strip()]
    unknown = sorted(set(chosen) - set(EXPORT_FORMATS))
    if not chosen or unknown:
        raise UserError(f"unknown export format in {formats!r}", where="--formats",
                        hint=f"use {', '.join(EXPORT_FORMATS)}")
    return [f for f in EXPORT_FORMATS if f in chosen]


def quantize_request(source: str, catalogue: Catalogue, *, recipe: str, formats: str, tp: int, pp: int,
                     device: str, calibration: str, samples: int | None, seq_len: int | None,
                     batch_size: int | None, awq_block_size: int | None, task: str | None,
                     out: Path | None) -> QuantizeRequest:
    """The quantize stage's request for one checkpoint (``REPO[@REVISION]`` or a directory, pulled once the
    options are known to be good), keyed by the versions installed here."""
    recipe_spec = catalogue.recipe(recipe)
    for name, size in (("--tp", tp), ("--pp", pp)):
        try:
            check_power_of_two(size, name)
        except ValueError as exc:
            raise UserError(str(exc), where=name) from None
    chosen_formats = export_formats(formats)
    checkpoint = pull_checkpoint(*parse_source(source))
    plan = calibration_plan(recipe_spec, calibration, calibration_fingerprint(calibration), samples=samples,
                            seq_len=seq_len, batch_size=batch_size)
    if awq_block_size is None:
        choice = choose_awq_block_size(recipe_spec, model_shape(checkpoint.local_path))
        if choice is not None and choice.size is None:
            raise UserError(choice.reason, where=f"--recipe {recipe}", hint="choose a recipe without INT4 blocks "
                            "(fp8, int8-sq), or a model whose widths divide by a supported block size")
        awq_block_size = choice.size if choice is not None else None
    key = quantize_key(checkpoint.key, keyed_recipe(recipe_spec, awq_block_size),
                       None if recipe_spec.is_passthrough else plan, installed_versions(),
                       {"tp": tp, "pp": pp} if "trtllm" in chosen_formats else None)
    return QuantizeRequest(
        checkpoint=checkpoint, recipe=recipe_spec, key=key, out_dir=str(out or WORK / "quantized" / key[:16]),
        formats=chosen_formats, tp=tp, pp=pp, device=device, calibration_dataset=calibration, samples=plan.samples,
        seq_len=plan.seq_len, batch_size=plan.batch_size, awq_block_size=awq_block_size, task=task)


def build_request(quantized: QuantizedCheckpoint, catalogue: Catalogue, *, target: str, kind: str | None,
                  config: PipelineConfig | None, profile: str, out: Path | None, model_id: str | None,
                  skip_gpu_check: bool) -> BuildRequest:
    """The build stage's request for one quantised checkpoint, with ``config``'s toolchains and build profile where
    one is given; ``kind`` None: an hf-quantized checkpoint."""
    kind = kind or "hf-quantized"
    if kind not in ARTEFACT_KINDS:
        raise UserError(f"unknown artefact kind {kind!r}", where="--kind",
                        hint=f"use one of: {', '.join(ARTEFACT_KINDS)}")
    target_spec = catalogue.target(target)
    if config is None and profile != "default":
        raise UserError("--profile needs --config (the file that defines it)", where="--profile")
    if config is not None and profile != "default" and profile not in config.profiles:
        raise UserError(f"unknown build profile {profile!r}", where="--profile",
                        hint=f"profiles in the config: default, {', '.join(config.profiles)}")
    toolchains = config.toolchains if config is not None else Toolchains()
    resolved = (config.profile(profile) if config is not None else BuildProfile()).merged_over(
        target_spec.build_defaults)
    artefact_kind = next(k for k in ARTEFACT_KINDS if k == kind)
    key = build_key(quantized.key, artefact_kind, target_spec, resolved,
                    builder_inputs(artefact_kind, target_spec, toolchains), tp=quantized.tp, pp=quantized.pp)
    return BuildRequest(
        quantized=quantized, recipe=catalogue.recipe(quantized.recipe), target=target_spec, kind=artefact_kind,
        profile=resolved, key=key, out_dir=str(out or WORK / "artefacts" / key[:16]),
        model_id=model_id or Path(quantized.source.repo_id).name.lower(), toolchains=toolchains,
        skip_gpu_check=skip_gpu_check)


# --- the ad-hoc commands' stages, each a named function the CLI calls ------------------------------------------------

def planned_llm_cell(config: Path | None, cell_id: str, **conflicting: object) -> tuple[Path, PipelineConfig, Cell]:
    """The LLM cell ``cell_id`` as ``config`` plans it (Hub revisions resolved, as the nightly does); options the
    command line gave beside it (``conflicting``, those not None) are refused, since the plan decides them."""
    from enginesmith.core.config import default_catalogue
    from pipeline.common.plan_sources import plan_config
    from pipeline.kinds.llm_steps import find_cell

    if config is None:
        raise UserError("--cell needs --config (the matrix that plans it)", where="--cell")
    given = [name.replace("_", "-") for name, value in conflicting.items() if value is not None]
    if given:
        raise UserError(f"--cell takes everything from the plan; drop --{', --'.join(given)}", where="--cell")
    pipeline, plan = plan_config(config, default_catalogue())
    planned = find_cell(plan, cell_id)
    if planned.status == "invalid":
        raise UserError(f"cell {planned.id} cannot be built: {planned.reason}", where="--cell")
    return config, pipeline, planned


def quantize_planned(config_path: Path, pipeline: PipelineConfig, cell: Cell) -> QuantizedCheckpoint:
    """The planned cell's quantize stage, as the nightly runs it (same key, same output directory)."""
    from pipeline.common import steps
    from pipeline.kinds import llm_steps

    return llm_steps.quantize(cell, llm_steps.pull(config_path, cell), steps.workdir(pipeline))


def quantize_source(request: QuantizeRequest) -> QuantizedCheckpoint:
    """Quantise and export one checkpoint as ``quantize_request`` asked."""
    from quantization.stage import quantize_checkpoint

    return quantize_checkpoint(request)


def read_quantized(quantized_dir: Path) -> QuantizedCheckpoint:
    """A finished quantize output directory's record; refused where the stage did not finish."""
    from quantization.stage import read_completed

    quantized = read_completed(quantized_dir)
    if quantized is None:
        raise UserError("not a finished quantize output (no completion marker)", where=str(quantized_dir),
                        hint="run `enginesmith quantize` (again: an interrupted run starts clean)")
    return quantized


def build_planned(quantized: QuantizedCheckpoint, quantized_dir: Path, config: Path | None, pipeline: PipelineConfig,
                  cell: Cell) -> tuple[Artefact, Path]:
    """The planned cell's build stage on ``quantized`` (which must be that cell's quantize output)."""
    from pipeline.common import steps
    from pipeline.kinds import llm_steps

    if quantized.key != cell.stage_keys.quantize:
        raise UserError(f"{quantized_dir} was quantised under key {quantized.key[:12]}; cell {cell.id} "
                        f"quantises under {cell.stage_keys.quantize[:12]}", where=str(quantized_dir),
                        hint=f"enginesmith quantize --config {config} --cell {cell.id}")
    built_dir = llm_steps.build(cell, quantized, steps.workdir(pipeline), pipeline)
    built = read_artefact(built_dir)
    assert built is not None
    return built, built_dir


def build_quantized(request: BuildRequest) -> Artefact:
    """Build (or find already built) the artefact ``build_request`` asked for."""
    from builders.stage import build_artefact

    return build_artefact(request)


def validate_planned(config_path: Path, pipeline: PipelineConfig, cell: Cell) -> ValidationReport:
    """The planned cell's built artefact against its checkpoint, as the nightly validates it."""
    from pipeline.common import steps
    from pipeline.kinds import llm_steps

    work = steps.workdir(pipeline)
    return llm_steps.validate(cell, llm_steps.built_artefact_dir(cell, work), llm_steps.pull(config_path, cell),
                              pipeline, work)


def task_exact_match(model_dir: Path, task: str, *, limit: int | None) -> tuple[float, int]:
    """Greedy BF16 exact match of a checkpoint on a shipped task's held-out set, and how many examples it scored."""
    from enginesmith.core.assets import task_eval_path
    from quantization.quality import evaluate_exact_match

    eval_path = task_eval_path(task)
    score = evaluate_exact_match(model_dir, eval_path, dtype="bfloat16", limit=limit)
    examples = sum(1 for line in eval_path.read_text().splitlines() if line.strip())
    return score, min(limit, examples) if limit else examples


def validate_sides(candidate: str, reference: str, *, workload: str | None, config: Path | None,
                   baseline: list[str], recipe: str | None, target: str | None, runtime: str | None,
                   tokenizer: Path | None, out_dir: Path) -> tuple[ValidationReport, dict[str, Path]]:
    """A candidate (an artefact directory, or a running server's URL) against a reference (the BF16 checkpoint
    directory, or a URL) on one workload: a preset, or ``config``'s with its gates. The report, and the files it was
    written to in ``out_dir``."""
    from builders.stage import tokenizer_dir as artefact_tokenizer_dir
    from enginesmith.core.config import default_catalogue, load_pipeline_config
    from enginesmith.core.serving import reference_recipe
    from enginesmith.core.specs import BuildProfile, GateSpec
    from validation.presets import preset
    from validation.report import write_report
    from validation.stage import ServerSide, seat_started_on_cpu
    from validation.stage import validate as run_validation

    candidate_path = Path(candidate)
    is_url = candidate.startswith(("http://", "https://"))
    artefact = None if is_url else read_artefact(candidate_path)
    if not is_url and artefact is None:
        raise UserError("not an artefact directory (no artefact.json) and not a URL", where="--candidate")
    if artefact is not None:
        recipes = {r.runtime: r for r in artefact.serve}
        if runtime is not None and runtime not in recipes:
            raise UserError(f"the artefact has no {runtime!r} runtime", where="--runtime",
                            hint=f"it has: {', '.join(recipes)}")
        chosen = recipes[runtime] if runtime else artefact.serve[0]
        candidate_side = ServerSide(role="candidate", name=artefact.lineage.model_id, runtime=chosen.runtime,
                                    recipe=chosen, root=candidate_path.resolve())
        recipe_id, target_id = artefact.lineage.recipe, artefact.target
        tokenizer_dir = artefact_tokenizer_dir(candidate_path, artefact.kind)
    else:
        candidate_side = ServerSide(role="candidate", name="candidate", runtime="external", url=candidate)
        recipe_id, target_id = recipe or "unknown", target or "unknown"
        if tokenizer is None and reference.startswith(("http://", "https://")):
            raise UserError("both sides are URLs: say which tokenizer builds the prompts", where="--tokenizer",
                            hint="pass the model's checkpoint directory")
        tokenizer_dir = tokenizer or Path(reference)
    on_cpu = target_id == "cpu"
    if reference.startswith(("http://", "https://")):
        reference_side = ServerSide(role="reference", name="reference", runtime="external", url=reference)
    else:
        reference_dir = Path(reference).resolve()
        if not (reference_dir / "config.json").is_file():
            raise UserError("the reference is neither a checkpoint directory nor a URL", where="--reference")
        profile = default_catalogue().target(target_id).build_defaults if target_id in default_catalogue().targets \
            else BuildProfile()
        reference_serve = reference_recipe(reference_dir, on_cpu=on_cpu, profile=profile,
                                           tp=artefact.tp if artefact else 1, pp=artefact.pp if artefact else 1)
        reference_side = ServerSide(role="reference", name="reference", runtime=reference_serve.runtime,
                                    recipe=reference_serve, root=reference_dir)
        if is_url:
            tokenizer_dir = reference_dir
    gates = GateSpec()
    if config is not None:
        pipeline = load_pipeline_config(config)
        chosen_workload, gates = pipeline.workload, pipeline.gates
        if workload is not None and workload != chosen_workload.name:
            chosen_workload = preset(workload)
    else:
        chosen_workload = preset(workload or ("tiny-addition" if on_cpu else "random-1k"))
    baselines = [ServerSide(role="baseline", name=url, runtime="external", url=url) for url in baseline]
    placement = seat_started_on_cpu(candidate_side, reference_side, on_cpu=on_cpu)
    report = run_validation(candidate_side, reference_side, workload=chosen_workload, gates=gates,
                            recipe_id=recipe_id, target_id=target_id, tokenizer_dir=tokenizer_dir, out_dir=out_dir,
                            baselines=baselines)
    report.notes.extend(placement.notes if placement else [])
    report.artefact_key = artefact.key if artefact else None
    return report, write_report(report, out_dir)
