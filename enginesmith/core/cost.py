"""What a planned cell costs a fleet: GPU-seconds per stage on its SKU, from the model's parameters, the recipe, the
workload and tuning sections and the SKU's spec-sheet figures (``bf16_dense_tflops``, ``memory_bandwidth_gbs`` in
``catalogue/targets.yaml``). An estimate, and stated as one: each stage says what it assumed.

Pure functions of the plan; ``enginesmith plan --estimate`` prints them, and the fleet bench's timed stage doubles
sleep for them (scaled). The figures below are round numbers of the kind a platform team uses to size a night, not
measurements of this repo; each is named so a measured one can replace it.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from enginesmith.core.memory import GIB, GPU_CALIBRATION_FACTOR, SERVED_REFERENCE_BYTES, reference_tp
from enginesmith.core.plan import Cell
from enginesmith.core.specs import PipelineConfig, TargetSpec, TuningSpec, WorkloadSpec

Stage = Literal["pull", "quantize", "build", "validate", "tune"]
STAGES: tuple[Stage, ...] = ("pull", "quantize", "build", "validate", "tune")

PULL_GBPS = 1.0  # checkpoint download from the Hub to the node (GB/s)
DISK_GBPS = 2.0  # local NVMe, reading a checkpoint or writing an export (GB/s)
CALIBRATION_MFU = 0.3  # share of the dense BF16 peak a calibration forward pass reaches
PREFILL_MFU = 0.4
DECODE_BANDWIDTH_SHARE = 0.6  # share of the memory bandwidth a decode step's weight reads reach
AWQ_SEARCH_PASSES = 10  # awq_lite scores a grid of scaling factors per layer: about this many forward passes more
QUALITY_PASSES = 3  # the quantise report's held-out logits: BF16, quantised, weight-only (plus the export check)
HELD_OUT_BLOCKS = 8
SERVER_START_S = 90.0  # a runtime process to healthy, less reading the weights: CUDA graphs, KV cache, warm-up
ENGINE_BUILD_S = 120.0  # trtllm-build's fixed part (tactics, plugins); plus its weight I/O and per-layer work below
ENGINE_BUILD_S_PER_B_PARAMS = 12.0
# How many greedy accuracy requests a side keeps in flight (validation/accuracy.py, lm-eval's generation tasks too):
# the server batches them (the cpu target's profile serves 16 sequences at once). Prompt logprobs stay at 4
# (validation.accuracy.MEMORY_BOUND_CONCURRENCY: the memory estimate).
ACCURACY_CONCURRENCY = 16
DEFAULT_TASK_EXAMPLES = 200  # a task whose size the caller does not know


class StageCost(BaseModel):
    stage: Stage
    pool: str = Field(description="the SKU whose nodes run it: the cell's, or quantize_on's for quantize")
    gpus: int = Field(ge=0, description="GPUs it holds on one node of that SKU")
    seconds: float = Field(ge=0)
    basis: str

    @property
    def gpu_seconds(self) -> float:
        return self.seconds * self.gpus


class CellCost(BaseModel):
    cell_id: str
    pool: str  # the cell's own SKU
    stages: list[StageCost]

    @property
    def gpus(self) -> int:
        """The most GPUs it holds at once (validation: the candidate's and the reference's)."""
        return max((stage.gpus for stage in self.stages), default=0)

    @property
    def seconds(self) -> float:
        return sum(stage.seconds for stage in self.stages)

    @property
    def gpu_seconds(self) -> float:
        return sum(stage.gpu_seconds for stage in self.stages)


class PoolTotal(BaseModel):
    pool: str
    cells: int
    gpu_seconds: float
    longest_cell_s: float


def estimate_cell(cell: Cell, *, workload: WorkloadSpec, tuning: TuningSpec | None = None,
                  task_examples: dict[str, int] | None = None) -> CellCost:
    """The stages of one buildable GPU cell with their GPUs and seconds. ``task_examples``: each accuracy task's
    number of examples (DEFAULT_TASK_EXAMPLES for one it lacks)."""
    target = cell.target
    if target.is_cpu or target.bf16_dense_tflops is None or target.memory_bandwidth_gbs is None:
        raise ValueError(f"no throughput figures for {target.id}: the estimate covers GPU SKUs of the catalogue")
    params_b = cell.model.params_b
    if params_b is None:
        raise ValueError(f"model {cell.model.id} has no params_b: the estimate scales by the parameter count")
    parameters = params_b * 1e9
    checkpoint_bytes = parameters * SERVED_REFERENCE_BYTES
    world = cell.tp * cell.pp
    quantizer = cell.quantize_target or target
    stages = [
        StageCost(stage="pull", pool=quantizer.id, gpus=0, seconds=checkpoint_bytes / (PULL_GBPS * 1e9),
                  basis=f"{checkpoint_bytes / 1e9:.0f} GB at {PULL_GBPS:g} GB/s"),
        _quantize(cell, quantizer, parameters, checkpoint_bytes),
    ]
    candidate_bytes = parameters * cell.recipe.weight_bytes_per_param
    if cell.kind == "trtllm-engine":
        seconds = (ENGINE_BUILD_S + ENGINE_BUILD_S_PER_B_PARAMS * params_b / world
                   + 2 * candidate_bytes / world / (DISK_GBPS * 1e9))
        stages.append(StageCost(stage="build", pool=target.id, gpus=world, seconds=seconds,
                                basis=f"trtllm-build: {ENGINE_BUILD_S:g} s + {ENGINE_BUILD_S_PER_B_PARAMS:g} s per "
                                      f"B parameters per rank, each rank's weights read and written"))
    reference_world = reference_tp(parameters, SERVED_REFERENCE_BYTES, target, tp=cell.tp, pp=cell.pp) * cell.pp
    per_round = sum(_level_seconds(level, workload, target, parameters, candidate_bytes / world,
                                   checkpoint_bytes / reference_world, world, reference_world)
                    for level in workload.concurrency)
    accuracy = sum(_accuracy_seconds(task_examples.get(task, DEFAULT_TASK_EXAMPLES) if task_examples else
                                     DEFAULT_TASK_EXAMPLES, workload, target, parameters, world, reference_world,
                                     candidate_bytes / world, checkpoint_bytes / reference_world)
                   for task in workload.accuracy_tasks)
    start = SERVER_START_S + max(candidate_bytes / world, checkpoint_bytes / reference_world) / (DISK_GBPS * 1e9)
    validate_s = start + workload.repeats * per_round + accuracy
    stages.append(StageCost(
        stage="validate", pool=target.id, gpus=world + reference_world, seconds=validate_s,
        basis=f"both servers up ({start:.0f} s), {workload.repeats} rounds of {len(workload.concurrency)} levels "
              f"({per_round:.0f} s a round, both sides in turn), {len(workload.accuracy_tasks)} accuracy task(s) "
              f"({accuracy:.0f} s); candidate tp×pp={world}, reference {reference_world} GPU(s)"))
    if tuning is not None and cell.tuning:
        levels = tuning.concurrency or workload.concurrency
        measured = workload.model_copy(update={k: v for k, v in (("min_duration_s", tuning.min_duration_s),
                                                                 ("min_requests", tuning.min_requests)) if v})
        one = sum(_side_level_seconds(level, measured, target, parameters, candidate_bytes / world, world)
                  for level in levels)
        seconds = min(tuning.budget_s, len(cell.tuning) * tuning.rounds * one) + len(cell.tuning) * SERVER_START_S
        stages.append(StageCost(stage="tune", pool=target.id, gpus=world, seconds=seconds,
                                basis=f"{len(cell.tuning)} profiles × {tuning.rounds} rounds × {len(levels)} levels, "
                                      f"at most the sweep's budget of {tuning.budget_s:g} s, each profile started"))
    return CellCost(cell_id=cell.id, pool=target.id, stages=stages)


def estimate_planned(cells: list[object], config: PipelineConfig) -> tuple[list[CellCost], list[str]]:
    """Each buildable GPU LLM cell's cost under the config's workload and tuning (each local accuracy task counted
    by its examples), and the ids of the cells it cannot estimate (invalid, the cpu target, a SKU without figures,
    a model without ``params_b``, another kind's)."""
    from contextlib import suppress

    from enginesmith.core.assets import read_task
    from enginesmith.core.errors import UserError

    examples: dict[str, int] = {}
    for task in config.workload.accuracy_tasks:
        with suppress(UserError, OSError):  # a task of lm-eval's registry: the estimate's default size
            examples[task] = len(read_task(task))
    costs, skipped = [], []
    for cell in cells:
        if (isinstance(cell, Cell) and cell.status == "build" and not cell.target.is_cpu
                and cell.target.bf16_dense_tflops is not None and cell.model.params_b is not None):
            costs.append(estimate_cell(cell, workload=config.workload, tuning=config.tuning, task_examples=examples))
        else:
            skipped.append(getattr(cell, "id", str(cell)))
    return costs, skipped


def pool_totals(costs: list[CellCost]) -> list[PoolTotal]:
    """Per SKU pool: the cells whose stages run there, their GPU-seconds there and the longest such cell."""
    totals: dict[str, PoolTotal] = {}
    for cost in costs:
        for pool in sorted({stage.pool for stage in cost.stages}):
            total = totals.setdefault(pool, PoolTotal(pool=pool, cells=0, gpu_seconds=0.0, longest_cell_s=0.0))
            here = [stage for stage in cost.stages if stage.pool == pool]
            total.cells += 1
            total.gpu_seconds += sum(stage.gpu_seconds for stage in here)
            total.longest_cell_s = max(total.longest_cell_s, sum(stage.seconds for stage in here))
    return [totals[pool] for pool in sorted(totals)]


def _quantize(cell: Cell, quantizer: TargetSpec, parameters: float, checkpoint_bytes: float) -> StageCost:
    if cell.recipe.is_passthrough:
        return StageCost(stage="quantize", pool=quantizer.id, gpus=0, seconds=checkpoint_bytes / (DISK_GBPS * 1e9),
                         basis="bf16: the checkpoint copied")
    gpus = _gpus_holding(checkpoint_bytes * GPU_CALIBRATION_FACTOR, quantizer)
    calibration = cell.calibration
    tokens = (calibration.samples if calibration else 512) * (calibration.seq_len if calibration else 512)
    held_out_tokens = HELD_OUT_BLOCKS * (calibration.seq_len if calibration else 512)
    passes = 1 + (AWQ_SEARCH_PASSES if "awq" in cell.recipe.id else 0)
    flops = 2 * parameters * (passes * tokens + QUALITY_PASSES * held_out_tokens)
    assert quantizer.bf16_dense_tflops is not None
    compute = flops / (quantizer.bf16_dense_tflops * 1e12 * CALIBRATION_MFU * gpus)
    io = (checkpoint_bytes + parameters * cell.recipe.weight_bytes_per_param * 2) / (DISK_GBPS * 1e9)
    return StageCost(stage="quantize", pool=quantizer.id, gpus=gpus, seconds=io + compute,
                     basis=f"{tokens} calibration tokens × {passes} pass(es) and the quality check's "
                           f"{QUALITY_PASSES} over {held_out_tokens} held-out tokens at {CALIBRATION_MFU:.0%} of "
                           f"{gpus} GPU(s)' BF16 peak; checkpoint read, exports written at {DISK_GBPS:g} GB/s")


def _gpus_holding(bytes_needed: float, target: TargetSpec) -> int:
    """The smallest power of two of the SKU's GPUs whose memory holds ``bytes_needed`` (at most a node)."""
    gpus = 1
    while gpus < target.gpus_per_node and gpus * target.memory_gib * GIB < bytes_needed:
        gpus *= 2
    return min(gpus, target.gpus_per_node)


def _request_seconds(workload: WorkloadSpec, target: TargetSpec, parameters: float, weight_bytes_per_gpu: float,
                     gpus: int, output_tokens: int, concurrency: int) -> float:
    """One request at ``concurrency`` in flight: its prefill, then decode steps that each read every weight once
    (memory-bound; the batch shares the read)."""
    assert target.bf16_dense_tflops is not None and target.memory_bandwidth_gbs is not None
    prefill = 2 * parameters * workload.input_len * concurrency / (target.bf16_dense_tflops * 1e12 * PREFILL_MFU * gpus)
    step = weight_bytes_per_gpu / (target.memory_bandwidth_gbs * 1e9 * DECODE_BANDWIDTH_SHARE)
    return prefill + output_tokens * step


def _side_level_seconds(level: int, workload: WorkloadSpec, target: TargetSpec, parameters: float,
                        weight_bytes_per_gpu: float, gpus: int) -> float:
    request = _request_seconds(workload, target, parameters, weight_bytes_per_gpu, gpus, workload.output_len, level)
    measured = max(workload.min_duration_s, math.ceil(workload.min_requests / level) * request)
    warmup = min(workload.warmup_max_s, 2 * math.ceil(max(workload.warmup_requests, 4 * level) / level) * request) \
        if workload.warmup_requests else 0.0
    return measured + warmup


def _level_seconds(level: int, workload: WorkloadSpec, target: TargetSpec, parameters: float,
                   candidate_per_gpu: float, reference_per_gpu: float, world: int, reference_world: int) -> float:
    return (_side_level_seconds(level, workload, target, parameters, candidate_per_gpu, world)
            + _side_level_seconds(level, workload, target, parameters, reference_per_gpu, reference_world))


def _accuracy_seconds(examples: int, workload: WorkloadSpec, target: TargetSpec, parameters: float, world: int,
                      reference_world: int, candidate_per_gpu: float, reference_per_gpu: float) -> float:
    batches = math.ceil(examples / ACCURACY_CONCURRENCY)
    tokens = max(workload.greedy_agreement_tokens, 16)
    return batches * (
        _request_seconds(workload, target, parameters, candidate_per_gpu, world, tokens, ACCURACY_CONCURRENCY)
        + _request_seconds(workload, target, parameters, reference_per_gpu, reference_world, tokens,
                           ACCURACY_CONCURRENCY))
