"""GPU detection: the pure matcher over the whole catalogue, and the CLI on a machine without a driver."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from enginesmith.core.config import default_catalogue
from enginesmith.core.gpus import (
    GIB,
    GpuRecord,
    VisibleDevicesError,
    detect,
    match_target,
    pci_device_id_from_nvml,
    read_gpus,
    visible_to_cuda,
)
from registry.machine import describe_machine
from tests.conftest import run_cli
from tests.fake_nvml import FakeBoard, FakeMig, FakeNvml
from validation.sampling import UsageSampler, gpu_memory_used_bytes

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


# --- GPUs as CUDA sees them, on an NVML double (tests/fake_nvml.py) ----------------------------------------

def _uuid(n: int) -> str:
    return f"GPU-{n:08x}-1111-2222-3333-{n:012x}"


def _node(monkeypatch, boards: list[FakeBoard]) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(boards).module())


def _seen(environ: dict[str, str]) -> list[tuple[int | None, int, str]]:
    """(cuda index, NVML index, uuid) of each device ``detect`` reports under ``environ``."""
    return [(d.gpu.cuda_index, d.gpu.index, d.gpu.uuid) for d in detect(GPU_TARGETS, environ)]


def test_cuda_visible_devices_by_index_keeps_the_named_gpus_in_its_order(monkeypatch):
    _node(monkeypatch, [FakeBoard(uuid=_uuid(n)) for n in range(4)])
    assert [nvml for _, nvml, _ in _seen({})] == [0, 1, 2, 3]
    assert _seen({"CUDA_VISIBLE_DEVICES": "2,0"}) == [(0, 2, _uuid(2)), (1, 0, _uuid(0))]
    assert _seen({"CUDA_VISIBLE_DEVICES": ""}) == []
    # As CUDA does, an entry naming nothing (or a device twice) ends the list there.
    assert _seen({"CUDA_VISIBLE_DEVICES": "1,7,2"}) == [(0, 1, _uuid(1))]
    assert _seen({"CUDA_VISIBLE_DEVICES": "3,3"}) == [(0, 3, _uuid(3))]
    with pytest.raises(VisibleDevicesError, match="'7'"):
        visible_to_cuda(read_gpus(), {"CUDA_VISIBLE_DEVICES": "1,7"}, strict=True)


def test_cuda_visible_devices_by_uuid_and_by_unique_prefix(monkeypatch):
    _node(monkeypatch, [FakeBoard(uuid=_uuid(n)) for n in range(4)])
    assert _seen({"CUDA_VISIBLE_DEVICES": f"{_uuid(3)},{_uuid(1)[:12]}"}) == [(0, 3, _uuid(3)), (1, 1, _uuid(1))]
    assert _seen({"CUDA_VISIBLE_DEVICES": "GPU-0000"}) == []  # a prefix of every board names none


def test_cuda_device_order_fastest_first_unless_pci_bus_id(monkeypatch):
    l40s = FakeBoard(uuid=_uuid(0), name="NVIDIA L40S", pci_device=0x26B9, memory_bytes=46068 * 1024**2,
                     capability=(8, 9))
    h100 = FakeBoard(uuid=_uuid(1))
    _node(monkeypatch, [l40s, h100])
    assert [d.match.target_id for d in detect(GPU_TARGETS, {})] == ["h100-sxm", "l40s"]
    assert [d.match.target_id for d in detect(GPU_TARGETS, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})] == ["l40s", "h100-sxm"]
    assert _seen({"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"}) == [(0, 1, _uuid(1))]


def _mig_node() -> list[FakeBoard]:
    sliced = FakeBoard(uuid=_uuid(0), mig=[
        FakeMig(uuid="MIG-aaaaaaaa-0000-0000-0000-000000000001", memory_bytes=40192 * 1024**2, slices=3,
                multiprocessors=60, gpu_instance_id=1),
        None,
        FakeMig(uuid="MIG-bbbbbbbb-0000-0000-0000-000000000002", memory_bytes=19968 * 1024**2, slices=2,
                multiprocessors=32, gpu_instance_id=5),
    ])
    return [sliced, FakeBoard(uuid=_uuid(1))]


def test_a_gpu_in_mig_mode_is_its_instances_each_with_its_own_memory(monkeypatch):
    _node(monkeypatch, _mig_node())
    detected = detect(GPU_TARGETS, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert [d.gpu.uuid[:12] for d in detected] == ["MIG-aaaaaaaa", "MIG-bbbbbbbb", _uuid(1)[:12]]
    first = detected[0]
    assert first.gpu.mig is not None and first.gpu.mig.profile == "3g" and first.gpu.mig.parent_index == 0
    assert first.gpu.memory_gib == pytest.approx(39.25) and first.gpu.multiprocessor_count == 60
    assert first.match.target_id == "h100-sxm" and "MIG instance 3g of a h100-sxm: 39.2 GiB, 60 SMs" in first.match.note
    only_small = detect(GPU_TARGETS, {"CUDA_VISIBLE_DEVICES": "MIG-bbbb"})
    assert [(d.gpu.cuda_index, d.gpu.mig.profile if d.gpu.mig else None) for d in only_small] == [(0, "2g")]


def test_resolve_on_a_mig_slice_sees_the_slices_memory_not_the_boards(monkeypatch):
    _node(monkeypatch, _mig_node())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-bbbb")
    machine = describe_machine("auto", default_catalogue())
    assert [(slot.index, slot.target_id, round(slot.memory_bytes / GIB, 1)) for slot in machine.gpus] == [
        (0, "h100-sxm", 19.5)]


def test_gpu_memory_is_sampled_for_the_servers_own_processes_not_the_whole_node(monkeypatch):
    server = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        other_job = 4_000_000  # a pid no process here has
        boards = [FakeBoard(uuid=_uuid(0), processes={server.pid: 30 * GIB, other_job: 40 * GIB}),
                  FakeBoard(uuid=_uuid(1), processes={server.pid: 28 * GIB})]
        _node(monkeypatch, boards)
        sampler = UsageSampler("http://127.0.0.1:9", server_pid=server.pid)
        sampler._sample()
        assert sampler.memory_source == "nvml-process" and sampler.peak_memory_bytes == 58 * GIB
        assert gpu_memory_used_bytes() == 98 * GIB  # the node's total, the other job included
        # NVML showing only PIDs from another namespace (a container): the node's total, and said so.
        _node(monkeypatch, [FakeBoard(uuid=_uuid(0), processes={other_job: 40 * GIB})])
        assert UsageSampler("http://127.0.0.1:9", server_pid=server.pid).memory_source == "nvml"
    finally:
        server.communicate(b"")


def test_pull_on_a_gpu_the_catalogue_lacks_lists_every_artefact_with_why_and_writes_nothing(monkeypatch, tmp_path,
                                                                                           capsys):
    """#31: `--target auto` on a node whose GPU (a V100) is not in the catalogue: like NIM's profile list, pull prints
    every artefact with why it does not run here and the GPU it could not match, exits 1, and writes nothing."""
    from enginesmith.cli import main
    from registry.local import LocalStore
    from registry.publish import publish_artefact
    from tests.registry_helpers import write_artefact

    store = LocalStore(tmp_path / "registry")
    publish_artefact(store, write_artefact(tmp_path / "fp8", target="h100-sxm", target_sm=90))
    publish_artefact(store, write_artefact(tmp_path / "engine", kind="trtllm-engine", target="a100-sxm",
                                           target_sm=80, versions={"tensorrt_llm": "1.2.1"}))
    _node(monkeypatch, [FakeBoard(uuid=_uuid(0), name="Tesla V100-PCIE-32GB", pci_device=0x1DB6,
                                  memory_bytes=32510 * 1024**2, capability=(7, 0))])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    dest, cache = tmp_path / "models" / "tiny-llama", tmp_path / "cache"
    registry = ["--registry", str(store.root)]
    pull = ["pull", "tiny-llama", "--dest", str(dest), "--cache-dir", str(cache), *registry]
    for argv in (pull, ["resolve", "tiny-llama", "--target", "auto", *registry]):
        monkeypatch.setattr(sys, "argv", ["enginesmith", *argv])
        with pytest.raises(SystemExit) as exited:
            main()
        seen = capsys.readouterr()
        out = " ".join(seen.out.split())
        assert exited.value.code == 1, seen
        assert "Tesla V100-PCIE-32GB (SM 7.0)" in out and out.count("incompatible") == 2, out
        assert "built for h100-sxm (SM 9.0)" in out and "built for a100-sxm (SM 8.0)" in out
        assert "PCI device 0x1DB6 (Tesla V100-PCIE-32GB) is not in the catalogue" in out
        assert "Traceback" not in seen.err
        if argv is pull:
            assert "nothing was fetched or written" in " ".join(seen.err.split())
    assert not dest.parent.exists() and not cache.exists()
