"""The machine to resolve against: detected GPUs (NVML), a named catalogue target, or the CPU.

The adapter half of resolution (``registry.resolve`` is the pure half).
"""

from __future__ import annotations

import os
from importlib import metadata

from enginesmith.core.config import Catalogue, default_catalogue
from enginesmith.core.errors import UserError
from enginesmith.core.gpus import GIB, detect
from enginesmith.core.specs import EXACT_RUNTIMES
from registry.resolve import CPU_TARGET, ENGINE_RUNTIME, GpuSlot, Machine, describe_gpus

AUTO_TARGET = "auto"


def describe_machine(target: str, catalogue: Catalogue | None = None, *,
                     runtime_version: str | None = None) -> Machine:
    """``auto``: the GPUs CUDA would show this process (``CUDA_VISIBLE_DEVICES``; a MIG instance with its own
    memory), the CPU when there are none; ``cpu``; or a catalogue SKU, as a node of
    ``gpus_per_node`` such GPUs. The catalogue defaults to ``default_catalogue()``, read only when the target
    needs it. Raises ``UserError`` for an unknown target."""
    runtimes = {ENGINE_RUNTIME: runtime_version} if runtime_version else _installed_runtimes()
    host_memory = _host_memory_bytes()
    if target == CPU_TARGET:
        return Machine(source="cpu", description="cpu (--target cpu)", host_memory_bytes=host_memory,
                       runtime_versions=runtimes)
    catalogue = catalogue or default_catalogue()
    if target == AUTO_TARGET:
        detected = detect(catalogue.targets.values())
        gpus = [
            GpuSlot(index=d.gpu.cuda_index if d.gpu.cuda_index is not None else d.gpu.index, name=d.gpu.name,
                    target_id=d.match.target_id, sm=d.gpu.sm, memory_bytes=d.gpu.memory_total_bytes)
            for d in detected
        ]
        if not gpus:
            return Machine(source="detected", description="cpu (no NVIDIA GPU detected)",
                           host_memory_bytes=host_memory, runtime_versions=runtimes)
        # An unknown GPU still runs what needs only its SM and memory; the note says why no SKU's build is exact.
        unknown = sorted({f"GPU {d.gpu.index}: {d.match.note}" for d in detected if d.match.target_id is None})
        return Machine(source="detected", description=describe_gpus(gpus) + " (detected)", gpus=gpus,
                       host_memory_bytes=host_memory, runtime_versions=runtimes,
                       notes=[f"{line} (ENGINESMITH_CONFIG_DIR names a catalogue of your own)" for line in unknown])
    if target not in catalogue.targets:
        raise UserError(f"unknown target {target!r}", where="--target",
                        hint=f"use auto, cpu or one of: {', '.join(t for t in catalogue.targets if t != CPU_TARGET)}")
    spec = catalogue.targets[target]
    if spec.is_cpu:
        return describe_machine(CPU_TARGET, catalogue, runtime_version=runtime_version)
    gpus = [GpuSlot(index=i, name=spec.name, target_id=spec.id, sm=spec.sm, memory_bytes=int(spec.memory_gib * GIB))
            for i in range(spec.gpus_per_node)]
    return Machine(source="target", description=f"{describe_gpus(gpus)} (--target {target})", gpus=gpus,
                   host_memory_bytes=host_memory, runtime_versions=runtimes)


def _installed_runtimes() -> dict[str, str]:
    """The TensorRT-LLM and TensorRT versions installed here, read from package metadata (importing them would take
    seconds): an engine of either kind runs only on the exact version it was built with."""
    found = {}
    for runtime in (exact.key for exact in EXACT_RUNTIMES.values()):
        try:
            found[runtime] = metadata.version(runtime)
        except metadata.PackageNotFoundError:
            continue
    return found


def _host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
