"""The ``enginesmith`` command: each verb calls into the packages and prints; no logic of its own."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from enginesmith import __version__
from enginesmith.console import print_json, stderr, stdout, table
from enginesmith.errors import UserError

app = typer.Typer(
    name="enginesmith",
    help="Open LLM checkpoints → quantised, per-GPU inference artefacts, validated against vLLM.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
_debug = {"enabled": bool(os.environ.get("ENGINESMITH_DEBUG"))}


@app.callback()
def _root(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for user errors.")] = False,
    version: Annotated[bool, typer.Option("--version", help="Print the version and exit.")] = False,
) -> None:
    if version:
        print(__version__)
        raise typer.Exit()
    _debug["enabled"] = _debug["enabled"] or debug


@app.command()
def schema(
    kind: Annotated[str, typer.Argument(help="pipeline | targets | recipes")] = "pipeline",
) -> None:
    """Print the JSON Schema of a config file (for editor completion)."""
    from pydantic import BaseModel

    from enginesmith.specs import PipelineConfig, RecipeCatalogue, TargetCatalogue

    models: dict[str, type[BaseModel]] = {
        "pipeline": PipelineConfig, "targets": TargetCatalogue, "recipes": RecipeCatalogue
    }
    if kind not in models:
        raise UserError(f"unknown schema {kind!r}", where="KIND", hint=f"choose one of: {', '.join(models)}")
    print(json.dumps(models[kind].model_json_schema(), indent=2))


@app.command()
def targets(json_output: JsonOption = False) -> None:
    """List the GPU SKU catalogue."""
    from enginesmith.config import default_catalogue

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
    from enginesmith.config import default_catalogue

    catalogue = default_catalogue()
    if json_output:
        print_json(list(catalogue.recipes.values()))
        return
    rows = []
    for recipe in catalogue.recipes.values():
        support = {kind: ",".join(f"{sm / 10:g}" for sm in s.sm) for kind, s in recipe.support.items()}
        rows.append([
            recipe.id, recipe.modelopt_config or "-", support.get("trtllm-engine", "-"),
            support.get("hf-quantized", "-"), "yes" if recipe.cpu.supported else "no",
        ])
    stdout.print(table("Recipes", ["id", "ModelOpt config", "engine SMs", "hf-quantized SMs", "cpu"], rows))


@app.command()
def plan(
    config: Annotated[Path, typer.Argument(help="A build-matrix config, e.g. configs/nightly.yaml.")],
    json_output: JsonOption = False,
) -> None:
    """Expand a build matrix into cells: what would be built, with each stage key, and what is invalid and why."""
    from enginesmith.config import default_catalogue
    from enginesmith.plan import plan_config_file

    result = plan_config_file(str(config), default_catalogue())
    if json_output:
        print_json(
            {
                "config": result.config_name,
                "cells": [
                    {
                        "id": c.id, "model": c.model.id, "repo": c.model.repo, "revision": c.source_revision,
                        "revision_pinned": c.revision_pinned, "recipe": c.recipe.id, "target": c.target.id,
                        "tp": c.tp, "pp": c.pp, "kind": c.kind, "status": c.status, "key": c.key,
                        "keys": c.keys.model_dump(), "reasons": [v.model_dump() for v in c.violations],
                    }
                    for c in result.cells
                ],
            }
        )
        return
    rows = []
    for c in result.cells:
        status = "[green]build[/]" if c.status == "build" else f"[red]invalid[/]: {c.reason}"
        revision = c.source_revision if len(c.source_revision) < 16 else c.source_revision[:12]
        rows.append([c.id, f"{c.model.repo}@{revision}", c.recipe.id, c.target.id, str(c.tp), c.kind,
                     c.key[:12], status])
    stdout.print(table(f"Plan: {result.config_name}", ["cell", "model@revision", "recipe", "target", "tp",
                                                       "kind", "key", "status"], rows))
    stdout.print(f"{len(result.buildable)} to build, {len(result.cells) - len(result.buildable)} invalid, "
                 f"{len(result.cells)} cells")


@app.command()
def gpus(json_output: JsonOption = False) -> None:
    """List local NVIDIA GPUs (via NVML) and the catalogue target each one is."""
    from enginesmith.config import default_catalogue
    from enginesmith.gpus import detect

    detected = detect(default_catalogue().targets.values())
    if json_output:
        print_json(detected)
        return
    if not detected:
        stdout.print("No NVIDIA GPU found (no NVML driver on this machine).")
        stdout.print("Name a target by hand where a command needs one, e.g. [bold]--target h100-sxm[/], "
                     "or [bold]--target cpu[/] to use the CPU; `enginesmith targets` lists them.")
        return
    rows = [
        [str(d.gpu.index), d.gpu.name, d.gpu.pci_device_id, f"{d.gpu.memory_gib:.1f}", d.gpu.sm_label,
         d.gpu.driver_version, d.match.target_id or f"[yellow]none[/]: {d.match.note}"]
        for d in detected
    ]
    stdout.print(table("GPUs", ["index", "name", "PCI device", "GiB", "SM", "driver", "target"], rows))


def main() -> None:
    """Console-script entry point: user errors print without a traceback and exit 2."""
    try:
        app()
    except UserError as exc:
        if _debug["enabled"]:
            raise
        stderr.print(f"[bold red]error:[/] {exc.render()}", markup=True, highlight=False)
        sys.exit(exc.exit_code)
