"""GPU detection: the pure matcher over the whole catalogue, and the CLI on a machine without a driver."""

from __future__ import annotations

import json

import pytest

from enginesmith.config import default_catalogue
from enginesmith.gpus import GIB, GpuRecord, match_target, pci_device_id_from_nvml, read_gpus
from tests.conftest import run_cli

# NVML reports a little less memory than the nominal size (an H100 80GB: 81559 MiB).
NVML_MEMORY_FRACTION = 0.995


def _record(pci: str, memory_gib: float, sm: int | None, name: str = "GPU") -> GpuRecord:
    return GpuRecord(index=0, name=name, pci_device_id=pci, memory_total_bytes=int(memory_gib * GIB), sm=sm)


GPU_TARGETS = [t for t in default_catalogue().targets.values() if not t.is_cpu]


@pytest.mark.parametrize("target", GPU_TARGETS, ids=lambda t: t.id)
def test_every_catalogue_gpu_matches_itself(target):
    for pci in target.pci_device_ids:
        for fraction in (NVML_MEMORY_FRACTION, 0.97):
            gpu = _record(pci, target.memory_gib * fraction, target.sm, name=target.nvml_names[0])
            assert match_target(gpu, GPU_TARGETS).target_id == target.id


def test_gh200_is_not_taken_for_h200_despite_its_name():
    gpu = _record("0x2342", 95.0, 90, name="NVIDIA GH200 480GB")
    assert match_target(gpu, GPU_TARGETS).target_id == "gh200"


def test_skus_sharing_a_name_are_told_apart_by_pci_id():
    assert match_target(_record("0x2330", 79.6, 90, "NVIDIA H100 80GB HBM3"), GPU_TARGETS).target_id == "h100-sxm"
    assert match_target(_record("0x2331", 79.6, 90, "NVIDIA H100 PCIe"), GPU_TARGETS).target_id == "h100-pcie"


def test_unknown_pci_id_is_unmatched_with_what_to_do():
    match = match_target(_record("0x1DB6", 32.0, 70, "Tesla V100-PCIE-32GB"), GPU_TARGETS)
    assert match.target_id is None
    assert "0x1DB6" in match.note and "--target" in match.note


def test_memory_that_fits_no_sku_is_unmatched():
    match = match_target(_record("0x2330", 40.0, 90), GPU_TARGETS)
    assert match.target_id is None and "40.0 GiB" in match.note


def test_sm_disagreeing_with_catalogue_is_unmatched():
    assert match_target(_record("0x2335", 140.0, 89), GPU_TARGETS).target_id is None


def test_nvml_pci_device_id_layout():
    # NVML packs (device << 16) | vendor; an H200 reads 0x233510DE.
    assert pci_device_id_from_nvml(0x233510DE) == "0x2335"


def test_read_gpus_is_empty_without_a_driver():
    pytest.importorskip("pynvml")
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    except pynvml.NVMLError:
        pass
    assert read_gpus() == []


def test_gpus_cli_without_gpu_prints_empty_json_and_exits_0():
    result = run_cli("gpus", "--json")
    if result.returncode == 0 and json.loads(result.stdout):
        pytest.skip("this machine has an NVIDIA GPU")
    assert result.returncode == 0
    assert json.loads(result.stdout) == []
    human = run_cli("gpus")
    assert human.returncode == 0
    assert "No NVIDIA GPU found" in human.stdout and "--target" in human.stdout


@pytest.mark.gpu
def test_gpus_cli_matches_the_real_gpu():
    result = run_cli("gpus", "--json")
    detected = json.loads(result.stdout)
    if not detected:
        pytest.skip("no NVIDIA GPU on this machine")
    assert all(d["match"]["target_id"] for d in detected), detected
