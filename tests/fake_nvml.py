"""TEST DOUBLE for NVML (the NVIDIA driver's management library, which cannot run without a GPU): a module with
the ``pynvml`` functions ``enginesmith.core.gpus`` calls, answering for a node described in code. Install it with
``monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(boards).module())``.

What it reports follows NVML's documented behaviour: boards in PCI bus order whatever ``CUDA_VISIBLE_DEVICES``
says; a board in MIG mode keeps its full memory and lists its instances through ``nvmlDeviceGetMigDeviceHandleByIndex``
(empty slots raise ``NVMLError``); ``nvmlDeviceGetAttributes`` answers for MIG instances only.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

GIB = 1024**3
MIB = 1024**2


class NVMLError(Exception):
    pass


@dataclass
class FakeMig:
    uuid: str
    memory_bytes: int
    slices: int
    multiprocessors: int
    gpu_instance_id: int
    compute_instance_id: int = 0


@dataclass
class FakeBoard:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    pci_device: int = 0x2330
    memory_bytes: int = 81559 * MIB  # what an H100 80GB reports
    capability: tuple[int, int] = (9, 0)
    mig: list[FakeMig | None] | None = None  # slots (None: empty); None: MIG mode off
    mig_slots: int = 7
    processes: dict[int, int] = field(default_factory=dict)  # pid → GPU bytes it holds (compute processes)


@dataclass
class FakeNvml:
    boards: list[FakeBoard]
    driver: str = "580.95.05"
    cuda_driver: int = 13000
    calls: list[str] = field(default_factory=list)

    def module(self) -> types.ModuleType:
        nvml = types.ModuleType("pynvml")
        nvml.NVMLError = NVMLError  # type: ignore[attr-defined]
        boards = self.boards

        def memory(total: int, used: int = 0) -> types.SimpleNamespace:
            return types.SimpleNamespace(total=total, used=used, free=total - used)

        def board(handle: object) -> FakeBoard:
            assert isinstance(handle, FakeBoard), "a MIG handle where NVML wants a board"
            return handle

        functions = {
            "nvmlInit": lambda: None,
            "nvmlShutdown": lambda: None,
            "nvmlSystemGetDriverVersion": lambda: self.driver,
            "nvmlSystemGetCudaDriverVersion": lambda: self.cuda_driver,
            "nvmlDeviceGetCount": lambda: len(boards),
            "nvmlDeviceGetHandleByIndex": lambda index: boards[index],
            "nvmlDeviceGetCudaComputeCapability": lambda handle: board(handle).capability,
            "nvmlDeviceGetMigMode": lambda handle: (int(board(handle).mig is not None),) * 2,
            "nvmlDeviceGetName": lambda handle: board(handle).name,
            "nvmlDeviceGetPciInfo": lambda handle: types.SimpleNamespace(
                pciDeviceId=(board(handle).pci_device << 16) | 0x10DE),
            "nvmlDeviceGetMemoryInfo": lambda handle: memory(handle.memory_bytes, used=sum(
                getattr(handle, "processes", {}).values())),
            "nvmlDeviceGetComputeRunningProcesses": lambda handle: [
                types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in board(handle).processes.items()],
            "nvmlDeviceGetUUID": lambda handle: handle.uuid,
            "nvmlDeviceGetMaxMigDeviceCount": lambda handle: board(handle).mig_slots,
            "nvmlDeviceGetMigDeviceHandleByIndex": _mig_slot,
            "nvmlDeviceGetAttributes": _attributes,
            "nvmlDeviceGetGpuInstanceId": lambda handle: _mig(handle).gpu_instance_id,
            "nvmlDeviceGetComputeInstanceId": lambda handle: _mig(handle).compute_instance_id,
        }
        for name, function in functions.items():
            setattr(nvml, name, function)
        return nvml


def _mig(handle: object) -> FakeMig:
    if not isinstance(handle, FakeMig):
        raise NVMLError("Not Supported")  # NVML answers these for MIG device handles only
    return handle


def _mig_slot(handle: FakeBoard, slot: int) -> FakeMig:
    instances = handle.mig or []
    if slot >= len(instances) or instances[slot] is None:
        raise NVMLError("Not Found")
    found = instances[slot]
    assert found is not None
    return found


def _attributes(handle: object) -> types.SimpleNamespace:
    mig = _mig(handle)
    return types.SimpleNamespace(multiprocessorCount=mig.multiprocessors, gpuInstanceSliceCount=mig.slices,
                                 memorySizeMB=mig.memory_bytes // MIB)
