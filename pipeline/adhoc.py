"""Quantising and building outside a matrix (``enginesmith quantize SOURCE --recipe R``, ``enginesmith build DIR
--target T``): the stage requests, keyed by the same functions the plan keys a cell with (``enginesmith.core.plan``),
from what the command line gives and what is installed here. The CLI parses and prints; this decides."""

from __future__ import annotations

from pathlib import Path

from builders.stage import BuildRequest
from enginesmith.core.artefacts import ExportFormat, QuantizedCheckpoint
from enginesmith.core.calibration import calibration_fingerprint
from enginesmith.core.checkpoints.inspect import model_shape
from enginesmith.core.checkpoints.pull import parse_source, pull_checkpoint
from enginesmith.core.config import Catalogue
from enginesmith.core.errors import UserError
from enginesmith.core.plan import build_key, builder_inputs, calibration_plan, quantize_key
from enginesmith.core.shapes import choose_awq_block_size, keyed_recipe
from enginesmith.core.specs import ARTEFACT_KINDS, BuildProfile, PipelineConfig, Toolchains, check_power_of_two
from quantization.stage import QuantizeRequest, installed_versions

EXPORT_FORMATS: tuple[ExportFormat, ...] = ("hf", "trtllm", "hf-bf16")
WORK = Path(".enginesmith/work")


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
