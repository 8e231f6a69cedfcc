"""Local NVIDIA GPUs: read with pynvml (the adapter), narrowed to what CUDA shows this process, and matched to
catalogue targets (pure functions).

NVML lists every GPU of the node in PCI bus order and knows nothing of ``CUDA_VISIBLE_DEVICES``; CUDA shows a
process only the devices that variable names, in its order, numbered from 0, and shows a GPU in MIG mode as its
MIG instances, each with its own memory and SMs. ``visible_to_cuda`` applies those rules, so "GPU 0" here is
the device a CUDA program (trtllm-build, vLLM) calls 0.

Matching uses the PCI device id and the memory size, never a name substring ("NVIDIA GH200 480GB" contains
"H200"; "NVIDIA H100" names more than one board). A MIG instance matches its board's SKU (the SM and recipes are
the board's) and keeps its own, smaller memory.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from enginesmith.core.specs import TargetSpec, normalize_pci_device_id

if TYPE_CHECKING:
    from enginesmith.core.artefacts import GpuInfo

NVIDIA_VENDOR_ID = 0x10DE
# NVML reports a little less than the nominal size (an H100 80GB shows 79.6 GiB); SKUs that share a PCI id
# differ by far more than this.
MEMORY_TOLERANCE = 0.12
GIB = 1024**3
T = TypeVar("T")
VISIBLE_ENV, ORDER_ENV = "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"


class MigInstance(BaseModel):
    """Where a MIG instance sits: its board, and the profile it was cut as."""

    profile: str  # "3g": its compute slices (nvidia-smi adds a rounded memory size, "3g.40gb"; ours is exact)
    parent_index: int  # the board's NVML index
    parent_uuid: str
    parent_memory_total_bytes: int
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


class GpuRecord(BaseModel):
    """One GPU (or MIG instance) as NVML reports it; ``index`` is the NVML index (of the board, for a MIG
    instance), ``cuda_index`` the number CUDA gives it in this process (``None`` until ``visible_to_cuda``)."""

    index: int
    name: str
    pci_device_id: str  # "0x2330": the device half of NVML's pciDeviceId ((device << 16) | 0x10DE)
    memory_total_bytes: int
    sm: int | None
    uuid: str = ""
    driver_version: str = ""
    cuda_driver_version: int | None = None
    mig_enabled: bool = False
    multiprocessor_count: int | None = None
    mig: MigInstance | None = None
    cuda_index: int | None = None

    @property
    def memory_gib(self) -> float:
        return self.memory_total_bytes / GIB

    @property
    def sm_label(self) -> str:
        return "-" if self.sm is None else f"{self.sm // 10}.{self.sm % 10}"


class TargetMatch(BaseModel):
    target_id: str | None
    note: str


def build_gpu_info(record: GpuRecord) -> GpuInfo:
    """What an artefact records of the GPU it was built on."""
    from enginesmith.core.artefacts import GpuInfo

    return GpuInfo(name=record.name, pci_device_id=record.pci_device_id, sm=record.sm,
                   memory_total_bytes=record.memory_total_bytes, driver_version=record.driver_version,
                   cuda_driver_version=record.cuda_driver_version)


class DetectedGpu(BaseModel):
    gpu: GpuRecord
    match: TargetMatch


def pci_device_id_from_nvml(pci_device_id: int) -> str:
    """NVML's 32-bit ``pciDeviceId`` → ``0xDDDD`` (the device id), as the catalogue writes it."""
    return f"0x{(pci_device_id >> 16) & 0xFFFF:04X}"


def match_target(gpu: GpuRecord, targets: Iterable[TargetSpec]) -> TargetMatch:
    """The catalogue target this GPU is, by PCI device id and memory; SM is checked as a consistency guard. A MIG
    instance is matched by its board's memory, and the note says it is a slice."""
    if gpu.mig is not None:
        board = gpu.model_copy(update={"mig": None, "memory_total_bytes": gpu.mig.parent_memory_total_bytes})
        match = match_target(board, targets)
        if match.target_id is None:
            return match
        return TargetMatch(target_id=match.target_id,
                           note=f"MIG instance {gpu.mig.profile} of a {match.target_id}: {gpu.memory_gib:.1f} GiB"
                                f"{f', {gpu.multiprocessor_count} SMs' if gpu.multiprocessor_count else ''}")
    by_pci = [t for t in targets if normalize_pci_device_id(gpu.pci_device_id) in t.pci_device_ids]
    if not by_pci:
        return TargetMatch(
            target_id=None,
            note=f"PCI device {gpu.pci_device_id} ({gpu.name}) is not in the catalogue; add it to "
                 "the catalogue's targets.yaml or name a target with --target",
        )
    fits = [t for t in by_pci if abs(gpu.memory_gib - t.memory_gib) <= MEMORY_TOLERANCE * t.memory_gib]
    if not fits:
        sizes = ", ".join(f"{t.id} {t.memory_gib:g} GiB" for t in by_pci)
        return TargetMatch(
            target_id=None,
            note=f"PCI device {gpu.pci_device_id} has {gpu.memory_gib:.1f} GiB, which matches none of: {sizes}",
        )
    best = min(fits, key=lambda t: abs(gpu.memory_gib - t.memory_gib))
    if gpu.sm is not None and best.sm is not None and gpu.sm != best.sm:
        return TargetMatch(
            target_id=None,
            note=f"PCI device {gpu.pci_device_id} matches {best.id} but reports SM {gpu.sm_label}, "
                 f"not {best.sm_label}; check the catalogue's targets.yaml",
        )
    return TargetMatch(target_id=best.id, note="matched by PCI device id and memory")


def detect(targets: Iterable[TargetSpec], environ: Mapping[str, str] | None = None) -> list[DetectedGpu]:
    """The GPUs CUDA shows this process (``environ``: this process's environment by default), in CUDA's order,
    each matched to a target."""
    target_list = list(targets)
    return [DetectedGpu(gpu=gpu, match=match_target(gpu, target_list)) for gpu in visible_gpus(environ)]


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[GpuRecord]:
    """The devices CUDA shows a process started with ``environ`` (this process's environment by default)."""
    return visible_to_cuda(read_gpus(), os.environ if environ is None else environ)


class VisibleDevicesError(ValueError):
    """A ``CUDA_VISIBLE_DEVICES`` entry that names no device here (CUDA would ignore it and all after it)."""


def visible_to_cuda(records: list[GpuRecord], environ: Mapping[str, str], *,
                    strict: bool = False) -> list[GpuRecord]:
    """The devices a CUDA program started with ``environ`` sees, in its order, with ``cuda_index`` set.

    Devices: each board not in MIG mode, and each MIG instance of a board in MIG mode (never the board itself).
    Order: PCI bus order (NVML's) under ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; CUDA's default, fastest first, puts
    higher compute capability, then more SMs, first (ties keep bus order). ``CUDA_VISIBLE_DEVICES``, when set,
    keeps the devices its entries name, in their order: an index into that order, ``GPU-<uuid>`` or
    ``MIG-<uuid>`` (a unique prefix is enough). As CUDA does, an entry that names nothing (or a device already
    named) ends the list; ``strict`` raises ``VisibleDevicesError`` instead.
    """
    devices = [r for r in records if r.mig is not None or not r.mig_enabled]
    if environ.get(ORDER_ENV, "FASTEST_FIRST").strip().upper() != "PCI_BUS_ID":
        devices = sorted(devices, key=lambda r: (-(r.sm or 0), -(r.multiprocessor_count or 0)))
    listed = environ.get(VISIBLE_ENV)
    if listed is not None:
        chosen: list[GpuRecord] = []
        for entry in (e.strip() for e in listed.split(",")):
            found = _named_device(entry, devices)
            if found is None or found in chosen:
                if strict:
                    reason = "a device already listed" if found is not None else "no device on this machine"
                    raise VisibleDevicesError(f"{VISIBLE_ENV} entry {entry!r} names {reason}; CUDA ignores it and "
                                              f"every entry after it")
                break
            chosen.append(found)
        devices = chosen
    return [device.model_copy(update={"cuda_index": position}) for position, device in enumerate(devices)]


def _named_device(entry: str, devices: list[GpuRecord]) -> GpuRecord | None:
    if entry.isdigit():
        position = int(entry)
        return devices[position] if position < len(devices) else None
    if entry.startswith(("GPU-", "MIG-")) and len(entry) > 4:
        matching = [d for d in devices if d.uuid.startswith(entry)]
        return matching[0] if len(matching) == 1 else None
    return None


class NvmlUnavailable(Exception):
    """No NVIDIA driver (or no NVML library) on this machine."""


def read_gpus() -> list[GpuRecord]:
    """Every NVIDIA GPU NVML sees; an empty list where there is no driver."""
    try:
        return _read_nvml()
    except NvmlUnavailable:
        return []


def _read_nvml() -> list[GpuRecord]:
    try:
        import pynvml
    except ImportError as exc:  # nvidia-ml-py is a base dependency; this only happens in a broken install
        raise NvmlUnavailable(str(exc)) from None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise NvmlUnavailable(str(exc)) from None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda_driver = pynvml.nvmlSystemGetCudaDriverVersion()
        records = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            try:
                mig_current, _ = pynvml.nvmlDeviceGetMigMode(handle)
                mig = bool(mig_current)
            except pynvml.NVMLError:
                mig = False
            board = GpuRecord(
                index=index,
                name=_text(pynvml.nvmlDeviceGetName(handle)),
                pci_device_id=pci_device_id_from_nvml(pynvml.nvmlDeviceGetPciInfo(handle).pciDeviceId),
                memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                sm=major * 10 + minor,
                uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                driver_version=driver,
                cuda_driver_version=cuda_driver,
                mig_enabled=mig,
            )
            records.append(board)
            if mig:
                records += _read_mig_instances(pynvml, handle, board)
        return records
    finally:
        pynvml.nvmlShutdown()


def _read_mig_instances(pynvml: Any, handle: Any, board: GpuRecord) -> list[GpuRecord]:
    """The MIG instances of a board in MIG mode, each with its own memory, SM count and UUID."""
    instances = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig_handle = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError:  # an empty slot
            continue
        memory = int(pynvml.nvmlDeviceGetMemoryInfo(mig_handle).total)
        attributes = _optional(pynvml, pynvml.nvmlDeviceGetAttributes, mig_handle)
        slices = getattr(attributes, "gpuInstanceSliceCount", None)
        profile = f"{slices}g" if slices else "?g"
        instance = MigInstance(
            profile=profile, parent_index=board.index, parent_uuid=board.uuid,
            parent_memory_total_bytes=board.memory_total_bytes,
            gpu_instance_id=_optional(pynvml, pynvml.nvmlDeviceGetGpuInstanceId, mig_handle),
            compute_instance_id=_optional(pynvml, pynvml.nvmlDeviceGetComputeInstanceId, mig_handle),
        )
        instances.append(board.model_copy(update={
            "name": f"{board.name} MIG {profile} {memory / GIB:.1f} GiB", "memory_total_bytes": memory,
            "uuid": _text(pynvml.nvmlDeviceGetUUID(mig_handle)),
            "multiprocessor_count": getattr(attributes, "multiprocessorCount", None), "mig": instance,
        }))
    return instances


def _optional(pynvml: Any, read: Callable[..., T], *args: Any) -> T | None:
    """A value older drivers or some boards do not report."""
    try:
        return read(*args)
    except (pynvml.NVMLError, AttributeError):
        return None


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
