"""The paths that need a real NVIDIA GPU: NVML detection against CUDA's own view, ModelOpt on CUDA, the
build stage's GPU check, GPU memory sampling, and ``pull --target auto`` choosing the detected SKU's artefact.

Every test here is marked ``gpu`` and skipped where NVML sees no GPU (tests/conftest.py). ``trtllm-build``
is still the labelled test double (tests/fakes): TensorRT-LLM is not installed on the GPU machines we test on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from enginesmith.core.config import default_catalogue
from enginesmith.core.gpus import detect, read_gpus
from tests.conftest import as_exported_in_trtllm_image, run_cli
from tests.waiting import wait_for

pytestmark = pytest.mark.gpu

CALIBRATION = ["--samples", "32", "--seq-len", "64", "--batch-size", "8"]
GIB = 1024**3


def _detected_target() -> str:
    detected = detect(default_catalogue().targets.values())
    target_id = detected[0].match.target_id
    assert target_id, detected[0].match.note
    return target_id


def test_nvml_agrees_with_cuda_on_every_gpu_and_matches_a_target():
    torch = pytest.importorskip("torch")
    assert torch.cuda.is_available()
    records = read_gpus()
    assert len(records) == torch.cuda.device_count()
    for record, detected in zip(records, detect(default_catalogue().targets.values()), strict=True):
        properties = torch.cuda.get_device_properties(record.index)
        assert record.sm == properties.major * 10 + properties.minor
        assert abs(record.memory_total_bytes - properties.total_memory) < 0.02 * record.memory_total_bytes
        assert detected.match.target_id, detected.match.note
        target = default_catalogue().targets[detected.match.target_id]
        assert record.name in target.nvml_names


@pytest.fixture(scope="module")
def quantized_on_cuda(tiny_model_dir, tmp_path_factory):
    """``enginesmith quantize --device cuda`` once per recipe for the whole module; returns its JSON output."""
    pytest.importorskip("modelopt")
    outputs: dict[str, dict] = {}

    def quantize(recipe: str) -> dict:
        if recipe not in outputs:
            started = time.monotonic()
            out = tmp_path_factory.mktemp("q") / recipe
            result = run_cli("quantize", str(tiny_model_dir), "--recipe", recipe, "--out", str(out), "--device",
                             "cuda", "--formats", "hf,trtllm", "--task", "addition", *CALIBRATION, "--json")
            assert result.returncode == 0, result.stderr[-3000:]
            outputs[recipe] = json.loads(result.stdout)
            print(f"{recipe} on cuda: {time.monotonic() - started:.1f} s, {outputs[recipe]['timings_s']}, "
                  f"{outputs[recipe]['quality']}")
        return outputs[recipe]

    return quantize


@pytest.mark.parametrize("recipe", ["fp8", "int4-awq"])
def test_modelopt_quantises_on_cuda_with_the_quality_report(recipe, quantized_on_cuda):
    output = quantized_on_cuda(recipe)
    quality = output["quality"]
    assert output["device"].startswith("cuda")
    assert 0 < quality["logits_rel_err"] < 0.5 and quality["top1_agreement"] > 0.5
    assert quality["export_dequant_rel_err"] is not None
    assert quality["export_dequant_rel_err"] <= quality["logits_rel_err"]
    # The tiny model's task accuracy survives quantisation on the GPU as it does on the CPU.
    assert quality["task_exact_match_quantized"] >= quality["task_exact_match_reference"] - 0.1
    assert (Path(output["out_dir"]) / "trtllm" / "rank0.safetensors").is_file()


def test_usage_sampler_reads_gpu_memory_through_nvml():
    torch = pytest.importorskip("torch")
    from validation.sampling import UsageSampler, gpu_memory_used_bytes

    torch.cuda.init()
    baseline = gpu_memory_used_bytes()
    assert baseline is not None
    # A closed loopback port: no KV metrics, memory from NVML alone.
    with UsageSampler("http://127.0.0.1:9", server_pid=None, interval_s=0.1) as sampler:
        block = torch.empty(4 * GIB, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        # Held until the sampler's own thread has seen it (not for a second that it may or may not sample in).
        wait_for(lambda: (sampler.peak_memory_bytes or 0) - baseline >= 3.5 * GIB,
                 "the sampler to see the 4 GiB block", timeout_s=60)
        del block
        torch.cuda.empty_cache()
    assert sampler.memory_source == "nvml" and sampler.kv_cache_usage_max is None
    assert sampler.peak_memory_bytes is not None
    assert sampler.peak_memory_bytes - baseline >= 3.5 * GIB


def test_engine_for_the_detected_gpu_passes_the_gpu_check_and_auto_pull_chooses_it(
        quantized_on_cuda, tmp_path, fake_trtllm_env):
    fp8_for_engine = as_exported_in_trtllm_image(Path(quantized_on_cuda("fp8")["out_dir"]), tmp_path / "fp8-image")
    here = _detected_target()
    other = "h100-sxm" if here != "h100-sxm" else "h200"  # same SM: only the GPU check can refuse it
    refused = run_cli("build", str(fp8_for_engine), "--out", str(tmp_path / "other"), "--target", other,
                      "--kind", "trtllm-engine", "--json", env=fake_trtllm_env)
    assert refused.returncode == 2 and f"no {other} GPU" in refused.stderr

    built = run_cli("build", str(fp8_for_engine), "--out", str(tmp_path / "engine"), "--target", here,
                    "--kind", "trtllm-engine", "--json", env=fake_trtllm_env)
    assert built.returncode == 0, built.stderr[-3000:]
    registry = str(tmp_path / "registry")
    published = run_cli("publish", str(tmp_path / "engine"), "--registry", registry, "--json")
    assert published.returncode == 0, published.stderr[-3000:]

    pulled = run_cli("pull", "tiny-llama", "--target", "auto", "--runtime-version", "1.2.1", "--registry", registry,
                     "--dest", str(tmp_path / "deploy"), "--cache-dir", str(tmp_path / "cache"), "--json")
    assert pulled.returncode == 0, pulled.stderr[-3000:]
    assert json.loads((tmp_path / "deploy" / "artefact.json").read_text())["target"] == here


def test_cuda_visible_devices_narrows_detection_as_cuda_does():
    """On real hardware: each GPU named by UUID (and by index) is the one CUDA shows a child process as device 0."""
    torch = pytest.importorskip("torch")
    records = read_gpus()
    assert records
    for record in records:
        if record.mig_enabled:
            continue
        seen = detect(default_catalogue().targets.values(), {"CUDA_VISIBLE_DEVICES": record.uuid})
        assert [(d.gpu.cuda_index, d.gpu.uuid) for d in seen] == [(0, record.uuid)]
        probe = ("import torch; p = torch.cuda.get_device_properties(0); "
                 "print(torch.cuda.device_count(), 'GPU-' + str(p.uuid))")
        shown = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                               env={**os.environ, "CUDA_VISIBLE_DEVICES": record.uuid})
        assert shown.stdout.split() == ["1", record.uuid], shown.stdout
    by_index = detect(default_catalogue().targets.values(), {"CUDA_VISIBLE_DEVICES": "0"})
    assert len(by_index) == 1 and torch.cuda.is_available()
