"""The typed parameters of the cell flows (the Prefect UI renders them as run forms) and what a cell's run ends with."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


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
