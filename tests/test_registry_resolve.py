"""Resolution: each candidate's status on a machine, and the choice (pure functions, no registry)."""

from __future__ import annotations

import math

import pytest

from enginesmith.core.config import default_catalogue
from enginesmith.core.gpus import read_gpus
from enginesmith.core.memory import SERVING_OVERHEAD
from registry.machine import describe_machine
from registry.resolve import GIB, Constraints, GpuSlot, Machine, assess, resolve
from tests.registry_helpers import manifest_for, throughput_report, write_artefact

H100 = GpuSlot(index=0, name="NVIDIA H100 80GB HBM3", target_id="h100-sxm", sm=90, memory_bytes=80 * GIB)
H100_PCIE = GpuSlot(index=0, name="NVIDIA H100 PCIe", target_id="h100-pcie", sm=90, memory_bytes=80 * GIB)
L4 = GpuSlot(index=0, name="NVIDIA L4", target_id="l4", sm=89, memory_bytes=24 * GIB)


def machine(*gpus: GpuSlot, trtllm: str | None = "1.2.1", host_gib: int = 64) -> Machine:
    slots = [g.model_copy(update={"index": i}) for i, g in enumerate(gpus)]
    return Machine(source="detected", description="test machine", gpus=slots,
                   host_memory_bytes=host_gib * GIB, runtime_versions={"tensorrt_llm": trtllm} if trtllm else {})


@pytest.fixture
def engine(tmp_path):
    """An engine for h100-sxm (SM 9.0), tp=2, built with TensorRT-LLM 1.2.1."""

    def make(**changes):
        options = {"kind": "trtllm-engine", "target": "h100-sxm", "target_sm": 90, "tp": 2,
                   "versions": {"tensorrt_llm": "1.2.1", "tensorrt": "10.13"}}
        validation = changes.pop("validation", None)
        published = changes.pop("published", None)
        directory = write_artefact(tmp_path / str(len(list(tmp_path.iterdir()))), **{**options, **changes})
        return manifest_for(directory, validation=validation, published=published)

    return make


def test_a_cpu_artefact_is_runnable_on_a_machine_without_gpus(tmp_path) -> None:
    manifest = manifest_for(write_artefact(tmp_path))
    candidate = assess(manifest, machine(), Constraints())
    assert candidate.status == "runnable" and candidate.eligible and candidate.reasons == []


def test_an_engine_on_its_sku_with_enough_gpus_is_runnable(engine) -> None:
    candidate = assess(engine(), machine(H100, H100), Constraints())
    assert candidate.status == "runnable"
    assert candidate.memory_available_bytes == 80 * GIB


def test_a_gpu_artefact_on_a_machine_without_gpus_is_incompatible(engine) -> None:
    candidate = assess(engine(), machine(), Constraints())
    assert candidate.status == "incompatible"
    assert "h100-sxm (SM 9.0)" in candidate.reasons[0] and "no NVIDIA GPU" in candidate.reasons[0]


def test_too_few_gpus_says_how_many_are_needed(engine) -> None:
    candidate = assess(engine(), machine(H100), Constraints())
    assert candidate.status == "incompatible"
    assert "tp×pp = 2" in candidate.reasons[0] and "has 1" in candidate.reasons[0]


def test_another_sm_names_both_skus(engine) -> None:
    candidate = assess(engine(), machine(L4, L4), Constraints())
    assert candidate.status == "incompatible"
    assert "h100-sxm (SM 9.0)" in candidate.reasons[0] and "2 × l4 (SM 8.9)" in candidate.reasons[0]


def test_same_sm_other_sku_needs_the_opt_in(engine) -> None:
    manifest = engine()
    without = assess(manifest, machine(H100_PCIE, H100_PCIE), Constraints())
    assert without.status == "same-sm-not-tuned" and not without.eligible
    assert "--allow-same-sm" in without.reasons[0]
    with_opt_in = resolve("tiny-llama", [manifest], machine(H100_PCIE, H100_PCIE), Constraints(allow_same_sm=True))
    assert with_opt_in.chosen is not None and with_opt_in.chosen.status == "same-sm-not-tuned"


def test_low_memory_gives_the_numbers(engine) -> None:
    small = GpuSlot(index=0, name="small", target_id="h100-sxm", sm=90, memory_bytes=16 * 1024)
    manifest = engine()
    candidate = assess(manifest, machine(small, small), Constraints())
    assert candidate.status == "low-memory" and not candidate.eligible
    assert "GiB per GPU" in candidate.reasons[0] and "has 0.0 GiB" in candidate.reasons[0]
    # the weights split over tp=2 ranks, times the runtime overhead factor
    assert candidate.memory_needed_bytes == math.ceil(manifest.total_bytes / 2 * SERVING_OVERHEAD)
    assert candidate.memory_available_bytes == 16 * 1024


def test_an_engine_needs_its_exact_tensorrt_llm(engine) -> None:
    other = assess(engine(), machine(H100, H100, trtllm="1.2.0"), Constraints())
    assert other.status == "incompatible" and "TensorRT-LLM 1.2.1" in other.reasons[0] and "1.2.0" in other.reasons[0]
    unknown = assess(engine(), machine(H100, H100, trtllm=None), Constraints())
    assert unknown.status == "runnable" and "cannot check" in unknown.notes[0]


def test_constraints_make_other_artefacts_incompatible(engine) -> None:
    candidate = assess(engine(recipe="fp8"), machine(H100, H100), Constraints(recipe="int4-awq", tp=4))
    assert candidate.status == "incompatible"
    assert any("--recipe" in r for r in candidate.reasons) and any("--tp" in r for r in candidate.reasons)


def test_the_objective_chooses_between_runnable_candidates(engine) -> None:
    fast = engine(recipe="fp8", validation=throughput_report(9000, 12.0))
    snappy = engine(recipe="int4-awq", validation=throughput_report(6000, 6.0))
    unvalidated = engine(recipe="bf16")
    here = machine(H100, H100)
    by_throughput = resolve("m", [unvalidated, snappy, fast], here, Constraints(objective="throughput"))
    by_latency = resolve("m", [unvalidated, snappy, fast], here, Constraints(objective="latency"))
    assert by_throughput.chosen is not None and by_throughput.chosen.key == fast.key
    assert by_latency.chosen is not None and by_latency.chosen.key == snappy.key
    assert by_throughput.candidates[-1].key == unvalidated.key  # no number ranks after those with one


def test_the_artefacts_own_sku_beats_a_faster_same_sm_one(engine) -> None:
    tuned = engine(target="h100-pcie", validation=throughput_report(5000, 10.0))
    other_sku = engine(validation=throughput_report(9000, 8.0))
    result = resolve("m", [other_sku, tuned], machine(H100_PCIE, H100_PCIE), Constraints(allow_same_sm=True))
    assert result.chosen is not None and result.chosen.key == tuned.key
    assert [c.status for c in result.candidates] == ["runnable", "same-sm-not-tuned"]


def test_on_a_gpu_machine_its_own_engine_beats_a_newer_cpu_artefact(engine, tmp_path) -> None:
    gpu_engine = engine(published="2026-01-01T00:00:00+00:00")
    cpu_artefact = manifest_for(write_artefact(tmp_path / "cpu"), published="2026-02-01T00:00:00+00:00")
    on_gpus = resolve("m", [cpu_artefact, gpu_engine], machine(H100, H100), Constraints())
    on_cpu = resolve("m", [cpu_artefact, gpu_engine], machine(), Constraints())
    assert on_gpus.chosen is not None and on_gpus.chosen.key == gpu_engine.key
    assert on_cpu.chosen is not None and on_cpu.chosen.key == cpu_artefact.key


def test_on_the_cpu_target_speed_is_no_reason_and_the_more_accurate_artefact_is_pulled(tmp_path) -> None:
    """#51 item 6: a hidden run pulled a model's fp8 artefact over its bf16 one on 32.1 against 30.7 tok/s, the same
    size, on the cpu target, where both serve the same BF16 kernels: the lossier artefact for nothing."""
    from tests.report_factory import llm_report

    fp8 = manifest_for(write_artefact(tmp_path / "fp8", recipe="fp8"), published="2026-02-01T00:00:00+00:00",
                       validation=llm_report([1.0, 1.0], peak_tok_s=32.1, accuracy=0.61))
    bf16 = manifest_for(write_artefact(tmp_path / "bf16", recipe="bf16"), published="2026-01-01T00:00:00+00:00",
                        validation=llm_report([1.0, 1.0], peak_tok_s=30.7, accuracy=0.64))
    result = resolve("m", [fp8, bf16], machine(), Constraints())
    assert result.chosen is not None and result.chosen.key == bf16.key
    assert all("ranked by accuracy" in candidate.ranked_by for candidate in result.candidates)


@pytest.mark.parametrize(("slower_rounds", "tie"), [([8800, 9400, 9100], True), ([6000, 6200, 6100], False)])
def test_throughputs_within_each_others_rounds_are_a_tie_broken_by_accuracy(engine, slower_rounds, tie) -> None:
    from tests.report_factory import llm_report

    faster = engine(recipe="fp8", published="2026-02-01T00:00:00+00:00", validation=llm_report(
        [1.0] * 3, peak_tok_s_by_round=[9000, 9600, 9300], accuracy=0.60, target="h100-sxm"))
    slower = engine(recipe="bf16", published="2026-01-01T00:00:00+00:00", validation=llm_report(
        [1.0] * 3, peak_tok_s_by_round=slower_rounds, accuracy=0.65, target="h100-sxm"))
    result = resolve("m", [faster, slower], machine(H100, H100), Constraints())
    assert result.chosen is not None and result.chosen.key == (slower.key if tie else faster.key)
    assert ("overlap the fastest" in result.chosen.ranked_by) is tie


def test_nothing_runnable_chooses_nothing(engine) -> None:
    result = resolve("m", [engine()], machine(), Constraints())
    assert result.chosen is None and result.candidates[0].status == "incompatible"


def test_a_named_target_is_a_full_node_of_that_sku() -> None:
    described = describe_machine("h100-sxm", default_catalogue(), runtime_version="1.2.1")
    assert described.source == "target" and len(described.gpus) == default_catalogue().targets["h100-sxm"].gpus_per_node
    assert {g.target_id for g in described.gpus} == {"h100-sxm"}
    assert described.runtime_versions == {"tensorrt_llm": "1.2.1"}
    assert describe_machine("cpu", default_catalogue()).gpus == []


@pytest.mark.skipif(bool(read_gpus()), reason="this machine has an NVIDIA GPU")
def test_auto_without_a_gpu_resolves_to_the_cpu() -> None:
    described = describe_machine("auto", default_catalogue())
    assert described.source == "detected" and described.gpus == []
    assert described.description.startswith("cpu")
