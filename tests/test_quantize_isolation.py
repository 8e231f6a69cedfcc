"""What the quantize stage does beyond ModelOpt's own, and where it runs: FP8 weights rounded once (as the fake
quantiser chose) before the export, and the nightly's stage in a process of its own (its own file, so the fast tier
runs it beside test_quantize.py's)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from enginesmith.core.checkpoints.pull import local_checkpoint
from enginesmith.core.config import default_catalogue
from enginesmith.core.errors import UserError

pytestmark = pytest.mark.quantize


def test_fp8_weights_are_exported_as_calibration_rounded_them(tiny_model_dir, tmp_path):
    """ModelOpt 0.47's HF exporter computes ``(weight / scale).to(float8)`` with a BF16 weight and a 0-dim scale, so
    the quotient is rounded to BF16 first and about one value in sixteen then ties to the even FP8 step, a step from
    the nearest one the fake quantiser (and so the quality report) chose: Gemma 3 270M's dequantised fp8 export was
    0.10 off. Exported after ``snap_fp8_weights``, every weight is the fake-quantised one."""
    import modelopt.torch.quantization as mtq
    import torch
    from transformers import AutoModelForCausalLM

    from quantization.dequant import dequantize_state_dict
    from quantization.export import export_hf, snap_fp8_weights

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        mtq.quantize(model, mtq.FP8_DEFAULT_CFG, lambda m: m(torch.randint(0, 200, (4, 32))))
    model = model.to(torch.bfloat16).float()  # as the stage rounds weights and scales before its quality check
    with torch.no_grad():
        chosen = {f"{name}.weight": module.weight_quantizer(module.weight)
                  for name, module in model.named_modules()
                  if getattr(module, "weight_quantizer", None) is not None and module.weight_quantizer.is_enabled}
    model = model.to(torch.bfloat16)

    def off_by_a_step(export_dir: Path) -> float:
        exported = dequantize_state_dict(export_dir)
        # an FP8 step is at least 1/16 of the value; scales read back may differ in their last bit
        differing = sum(int((~torch.isclose(exported[name], weight, rtol=1e-3, atol=0)).sum())
                        for name, weight in chosen.items())
        return differing / sum(weight.numel() for weight in chosen.values())

    twin = copy.deepcopy(model)  # the exporter rewrites the weights it exports: one export per model
    export_hf(model, tmp_path / "as-modelopt", tiny_model_dir)
    assert off_by_a_step(tmp_path / "as-modelopt") > 0.02  # the double rounding, as ModelOpt exports
    assert snap_fp8_weights(twin) == len(chosen)
    export_hf(twin, tmp_path / "snapped", tiny_model_dir)
    assert off_by_a_step(tmp_path / "snapped") == 0


def test_the_nightlys_quantize_stage_runs_in_a_process_of_its_own_and_brings_back_its_result_or_its_error(
        tiny_model_dir, tmp_path):
    """#49: quantising Gemma 3 270M in the flow's process left 4.1 GiB of its 9.2 GiB peak with the flow through
    validation. The child returns all of it on exit: this process does not hold the model (its RSS grows by far
    less than the child's fp32 copy), the result is the one quantize_checkpoint writes, a finished output is read
    without a child, and a UserError raised in the child comes back as that error, naming the same place."""
    import resource

    from quantization.own_process import quantize_in_own_process
    from quantization.stage import QuantizeRequest

    def rss_bytes() -> int:
        return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) * 1024

    request = QuantizeRequest(checkpoint=local_checkpoint(tiny_model_dir), recipe=default_catalogue().recipes["fp8"],
                              key="a" * 64, out_dir=str(tmp_path / "out"), formats=["hf"], samples=16, seq_len=32,
                              batch_size=8)
    before = rss_bytes()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    result = quantize_in_own_process(request)
    child_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    assert result.key == request.key and (tmp_path / "out" / "hf" / "config.json").is_file()
    assert child_peak > children_before or child_peak > 300 * 2**20  # the work happened in a child
    assert rss_bytes() - before < 100 * 2**20
    assert quantize_in_own_process(request) == result  # finished: read here
    other = request.model_copy(update={"key": "b" * 64})
    with pytest.raises(UserError) as caught:
        quantize_in_own_process(other)
    assert caught.value.where == str(tmp_path / "out") and "another quantised checkpoint" in caught.value.message
    assert caught.value.hint and "--out" in caught.value.hint
