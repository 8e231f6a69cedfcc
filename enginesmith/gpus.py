"""Local NVIDIA GPUs: read with pynvml (the adapter), matched to catalogue targets (a pure function).

Matching uses the PCI device id and the memory size, never a name substring ("NVIDIA GH200 480GB" contains
"H200"; "NVIDIA H100" names more than one board).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel

from enginesmith.specs import TargetSpec, normalize_pci_device_id

NVIDIA_VENDOR_ID = 0x10DE
# NVML reports a little less than the nominal size (an H100 80GB shows 79.6 GiB); SKUs that share a PCI id
# differ by far more than this.
MEMORY_TOLERANCE = 0.12
GIB = 1024**3


class GpuRecord(BaseModel):
    """One GPU as NVML reports it."""

    index: int
    name: str
    pci_device_id: str  # "0x2330": the device half of NVML's pciDeviceId ((device << 16) | 0x10DE)
    memory_total_bytes: int
    sm: int | None
    uuid: str = ""
    driver_version: str = ""
    cuda_driver_version: int | None = None
    mig_enabled: bool = False

    @property
    def memory_gib(self) -> float:
        return self.memory_total_bytes / GIB

    @property
    def sm_label(self) -> str:
        return "-" if self.sm is None else f"{self.sm // 10}.{self.sm % 10}"


class TargetMatch(BaseModel):
    target_id: str | None
    note: str


class DetectedGpu(BaseModel):
    gpu: GpuRecord
    match: TargetMatch


def pci_device_id_from_nvml(pci_device_id: int) -> str:
    """NVML's 32-bit ``pciDeviceId`` → ``0xDDDD`` (the device id), as the catalogue writes it."""
    return f"0x{(pci_device_id >> 16) & 0xFFFF:04X}"


def match_target(gpu: GpuRecord, targets: Iterable[TargetSpec]) -> TargetMatch:
    """The catalogue target this GPU is, by PCI device id and memory; SM is checked as a consistency guard."""
    by_pci = [t for t in targets if normalize_pci_device_id(gpu.pci_device_id) in t.pci_device_ids]
    if not by_pci:
        return TargetMatch(
            target_id=None,
            note=f"PCI device {gpu.pci_device_id} ({gpu.name}) is not in the catalogue; add it to "
                 "configs/targets.yaml or name a target with --target",
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
                 f"not {best.sm_label}; check configs/targets.yaml",
        )
    return TargetMatch(target_id=best.id, note="matched by PCI device id and memory")


def detect(targets: Iterable[TargetSpec]) -> list[DetectedGpu]:
    target_list = list(targets)
    return [DetectedGpu(gpu=gpu, match=match_target(gpu, target_list)) for gpu in read_gpus()]


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
            records.append(
                GpuRecord(
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
            )
        return records
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
