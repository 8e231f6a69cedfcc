"""Resolution: which published artefacts can run on a machine, and which one to pull. Pure: no I/O.

Every candidate gets a status, like NIM's profile list:
- ``runnable``: the artefact's SKU, enough GPUs, the right runtime version, enough memory;
- ``same-sm-not-tuned``: the GPUs have the artefact's SM but are another SKU (chosen only with the opt-in);
- ``low-memory``: it would run, but the weights do not fit (with the numbers);
- ``incompatible``: with every reason (SKU, SM, GPU count, runtime version, a constraint it fails).
The best eligible candidate is chosen by the validation report's number for the objective.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel

from enginesmith.memory import GIB, SERVING_OVERHEAD, serving_need
from registry.manifest import Manifest, Objective, higher_is_better, parse_timestamp, validation_metric

Status = Literal["runnable", "same-sm-not-tuned", "low-memory", "incompatible"]
STATUS_ORDER: dict[str, int] = {"runnable": 0, "same-sm-not-tuned": 1, "low-memory": 2, "incompatible": 3}
CPU_TARGET = "cpu"
ENGINE_KIND = "trtllm-engine"
ENGINE_RUNTIME = "tensorrt_llm"



class GpuSlot(BaseModel):
    """One GPU an artefact could use."""

    index: int
    name: str
    target_id: str | None  # the catalogue SKU it is, or None when it matched none
    sm: int | None
    memory_bytes: int

    @property
    def label(self) -> str:
        return self.target_id or self.name


class Machine(BaseModel):
    """Where the artefact would run: its GPUs (none for the CPU), host memory, and known runtime versions."""

    source: Literal["detected", "target", "cpu"]  # NVML (possibly no GPU), --target SKU, --target cpu
    description: str
    gpus: list[GpuSlot] = []
    host_memory_bytes: int | None = None
    runtime_versions: dict[str, str] = {}  # e.g. {"tensorrt_llm": "1.2.1"}; absent = unknown


class Constraints(BaseModel):
    recipe: str | None = None
    tp: int | None = None
    allow_same_sm: bool = False
    objective: Objective = "throughput"


class Candidate(BaseModel):
    model: str
    key: str
    kind: str
    recipe: str
    target: str
    target_sm: int | None
    tp: int
    pp: int
    total_bytes: int
    published: str
    status: Status
    reasons: list[str]  # why it is not runnable; empty when it is
    notes: list[str]  # what could not be checked
    memory_needed_bytes: int | None  # per GPU (or host memory for the CPU), estimated from the weights
    memory_available_bytes: int | None
    metric: float | None  # the objective's number from the validation report
    eligible: bool  # may be chosen: runnable, or same-SM with the opt-in

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.key}"


class Resolution(BaseModel):
    model: str
    machine: Machine
    constraints: Constraints
    candidates: list[Candidate]  # best first
    chosen: Candidate | None


def sm_label(sm: int | None) -> str:
    return "-" if sm is None else f"{sm // 10}.{sm % 10}"


def memory_needed_bytes(total_bytes: int, world_size: int) -> int:
    """Per-GPU memory estimate: the artefact's bytes split over its ranks, times the runtime overhead factor."""
    return serving_need("candidate", total_bytes, world_size).per_device_bytes


def describe_gpus(gpus: Iterable[GpuSlot]) -> str:
    counts = Counter((g.label, g.sm) for g in gpus)
    return ", ".join(f"{n} × {label} (SM {sm_label(sm)})" for (label, sm), n in sorted(counts.items(),
                                                                                      key=lambda kv: kv[0][0]))


def assess(manifest: Manifest, machine: Machine, constraints: Constraints) -> Candidate:
    """One manifest's status on ``machine`` under ``constraints``."""
    artefact = manifest.artefact
    world = artefact.world_size
    reasons: list[str] = []
    notes: list[str] = []
    same_sm_reason: str | None = None
    needed = memory_needed_bytes(manifest.total_bytes, world)
    available: int | None = None

    if constraints.recipe is not None and manifest.recipe != constraints.recipe:
        reasons.append(f"recipe {manifest.recipe}, not {constraints.recipe} (--recipe)")
    if constraints.tp is not None and artefact.tp != constraints.tp:
        reasons.append(f"tp {artefact.tp}, not {constraints.tp} (--tp)")

    if artefact.target == CPU_TARGET:
        if artefact.kind == ENGINE_KIND:
            reasons.append("a TensorRT-LLM engine cannot target the cpu")
        available = machine.host_memory_bytes
        needed = memory_needed_bytes(manifest.total_bytes, 1)
    else:
        built_for = f"built for {artefact.target} (SM {sm_label(artefact.target_sm)})"
        exact = sorted((g for g in machine.gpus if g.target_id == artefact.target), key=lambda g: -g.memory_bytes)
        same_sm = sorted((g for g in machine.gpus if artefact.target_sm is not None and g.sm == artefact.target_sm),
                         key=lambda g: (g.target_id != artefact.target, -g.memory_bytes))
        if len(exact) >= world:
            available = min(g.memory_bytes for g in exact[:world])
        elif len(same_sm) >= world:
            available = min(g.memory_bytes for g in same_sm[:world])
            same_sm_reason = (f"{built_for}; this machine's {describe_gpus(same_sm[:world])} has the same SM but "
                              "another SKU, which the artefact is not tuned for (allow with --allow-same-sm)")
        elif not machine.gpus:
            where = "no GPU is selected (--target cpu)" if machine.source == "cpu" else "this machine has no NVIDIA GPU"
            reasons.append(f"{built_for}; {where}")
        elif exact or same_sm:
            fitting = exact or same_sm
            reasons.append(f"needs tp×pp = {world} GPUs of SM {sm_label(artefact.target_sm)}; "
                           f"this machine has {len(fitting)} ({describe_gpus(fitting)})")
        else:
            reasons.append(f"{built_for}; this machine has {describe_gpus(machine.gpus)}")

    if artefact.kind == ENGINE_KIND:
        required = artefact.versions.get(ENGINE_RUNTIME)
        installed = machine.runtime_versions.get(ENGINE_RUNTIME)
        if required is None:
            notes.append("the manifest does not record its TensorRT-LLM version: cannot check the runtime")
        elif installed is None:
            notes.append(f"needs TensorRT-LLM {required}; cannot check: it is not installed here "
                         "(pass --runtime-version)")
        elif installed != required:
            reasons.append(f"built with TensorRT-LLM {required}; this machine has {installed} "
                           "(an engine runs only on the exact version)")

    status: Status
    if reasons:
        status = "incompatible"
    elif available is not None and needed > available:
        status = "low-memory"
        reasons.append(f"needs ~{needed / GIB:.1f} GiB per {'GPU' if artefact.target != CPU_TARGET else 'host'} "
                       f"(weights × {SERVING_OVERHEAD:g}), has {available / GIB:.1f} GiB")
    elif same_sm_reason:
        status = "same-sm-not-tuned"
        reasons.append(same_sm_reason)
    else:
        status = "runnable"
    return Candidate(
        model=manifest.model, key=manifest.key, kind=artefact.kind, recipe=manifest.recipe, target=artefact.target,
        target_sm=artefact.target_sm, tp=artefact.tp, pp=artefact.pp, total_bytes=manifest.total_bytes,
        published=manifest.published, status=status, reasons=reasons, notes=notes, memory_needed_bytes=needed,
        memory_available_bytes=available, metric=validation_metric(manifest.validation, constraints.objective),
        eligible=status == "runnable" or (status == "same-sm-not-tuned" and constraints.allow_same_sm),
    )


def resolve(model: str, manifests: Iterable[Manifest], machine: Machine, constraints: Constraints) -> Resolution:
    """Every manifest of ``model`` assessed on ``machine``, best first, and the one to pull (or ``None``).

    Best: eligible before not; the artefact's own SKU before a same-SM one, and either before a cpu artefact
    (which runs anywhere, but leaves the GPUs idle); a validation number before none; the better number for
    the objective; the newest.
    """
    candidates = [assess(m, machine, constraints) for m in manifests]
    sign = -1.0 if higher_is_better(constraints.objective) else 1.0

    def rank(candidate: Candidate) -> tuple[bool, int, bool, bool, float, float, str]:
        return (
            not candidate.eligible,
            STATUS_ORDER[candidate.status],
            candidate.target == CPU_TARGET,
            candidate.metric is None,
            sign * candidate.metric if candidate.metric is not None else 0.0,
            -_epoch(candidate.published),
            candidate.key,
        )

    candidates.sort(key=rank)
    chosen = candidates[0] if candidates and candidates[0].eligible else None
    return Resolution(model=model, machine=machine, constraints=constraints, candidates=candidates, chosen=chosen)


def _epoch(timestamp: str) -> float:
    return parse_timestamp(timestamp).timestamp()
