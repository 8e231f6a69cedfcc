"""The typed parameters of the cell flows (the Prefect UI renders them as run forms) and what a cell's run ends with."""

from __future__ import annotations

from enum import Enum
from typing import Literal

from pydantic import BaseModel, Field

from enginesmith.core.config import default_catalogue


class CellSummary(BaseModel):
    """What happened to one cell, for the nightly summary."""

    cell: str
    status: Literal["built", "cached", "quantized", "invalid", "blocked", "failed", "no-worker"]
    key: str = ""
    reason: str = ""
    throughput_ratio: float | None = None
    tpot_ratio: float | None = None
    flow_run: str = ""
    worker: str = Field("", description="The Prefect worker whose node ran the cell; empty when it ran in the "
                                        "nightly's own process")


RUN_CELL_FLOW = "run-cell"


class RunCellParams(BaseModel):
    """Build, validate and publish one cell of any kind, named by its id in the config's plan."""

    config: str = Field("configs/examples/minilm-cpu.yaml", description="Matrix config (path in the checkout)")
    cell: str = Field("all-minilm-l6-v2/int8/cpu/onnx", description="Cell id as `enginesmith plan` lists it")
    until: str | None = Field(None, description="Stop after this stage (a stage that runs on another pool's "
                                                "nodes and hands its output over through the registry)")


BUILD_CELL_FLOW = "build-cell"
_catalogue = default_catalogue()
# Selects in the UI: the catalogue's ids at import time.
RecipeName = Enum("RecipeName", {r.replace("-", "_"): r for r in _catalogue.recipes}, type=str)  # type: ignore[misc]
TargetName = Enum("TargetName", {t.replace("-", "_"): t for t in _catalogue.targets}, type=str)  # type: ignore[misc]


class BuildCellParams(BaseModel):
    """Build, validate and publish one cell: a model of the config, quantised with a recipe, for a GPU SKU."""

    config: str = Field("configs/examples/tiny-cpu.yaml",
                        description="Matrix config (path in the checkout): models, profiles, workload, registry")
    model: str = Field("tiny-llama", description="Model id as the config names it")
    revision: str | None = Field(None, description="Override the config's revision: branch, tag or commit sha")
    recipe: RecipeName = Field(RecipeName("int4-awq"), description="Quantisation recipe")
    target: TargetName = Field(TargetName("cpu"), description="GPU SKU (or cpu) to build for")
    kind: Literal["hf-quantized", "trtllm-engine"] = Field("hf-quantized", description="Artefact kind")
    tp: int = Field(1, ge=1, le=64, description="Tensor-parallel GPUs (a power of two)")
    pp: int = Field(1, ge=1, le=64, description="Pipeline-parallel stages (a power of two)")
    profile: str = Field("default", description="Build profile: 'default' (the config's build_profile) or a name "
                                                "under the config's profiles")
    min_throughput_ratio: float | None = Field(None, gt=0, description="Gate override: candidate/reference throughput")
    max_tpot_ratio: float | None = Field(None, gt=0, description="Gate override: candidate/reference TPOT at c=1")
    max_accuracy_drop_points: float | None = Field(None, ge=0, description="Gate override: accuracy drop, points")
    until: Literal["publish", "quantize"] = Field(
        "publish", description="'quantize': pull and quantise only, and stash the output in the registry for the node "
                               "that builds (what a cell's build run asks of the pool its config's quantize_on names)")
