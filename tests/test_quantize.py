"""The quantize stage with the real ModelOpt on the CPU: recipes, both exports, their fixes and checks."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from enginesmith.core.checkpoints.pull import local_checkpoint
from enginesmith.core.config import default_catalogue
from enginesmith.core.errors import UserError
from quantization.export import fix_trtllm_config
from tests.conftest import REPO_ROOT, TINY_CALIBRATION, needs_vllm_cpu, run_cli, write_tiny_matrix
from tests.waiting import kill_when, pause_when, resume, wait_for

pytestmark = pytest.mark.quantize
LONG_WAIT_S = 300  # a safety net for waits on what a quantize run does (it starts by importing torch)

SMALL = TINY_CALIBRATION


def _quantize(model_dir: Path, recipe: str, out: Path, *extra: str) -> dict:
    result = run_cli("quantize", str(model_dir), "--recipe", recipe, "--out", str(out), *SMALL, *extra, "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.fixture
def fp8_output(tiny_quantized):
    return tiny_quantized("fp8")


@pytest.fixture
def int4_output(tiny_quantized):
    return tiny_quantized("int4-awq")


def test_fp8_exports_both_formats_with_quality_report(fp8_output):
    out = Path(fp8_output["out_dir"])
    hf_quant = json.loads((out / "hf" / "hf_quant_config.json").read_text())["quantization"]
    assert hf_quant["quant_algo"] == "FP8"
    assert json.loads((out / "hf" / "config.json").read_text())["quantization_config"]["quant_method"] == "modelopt"
    assert (out / "hf" / "tokenizer.json").is_file()  # ModelOpt does not export it; the stage copies it
    trtllm = json.loads((out / "trtllm" / "config.json").read_text())
    assert trtllm["quantization"]["quant_algo"] == "FP8" and (out / "trtllm" / "rank0.safetensors").is_file()
    quality = fp8_output["quality"]
    assert 0 < quality["logits_rel_err"] < 0.5 and 0.5 < quality["top1_agreement"] <= 1
    assert quality["task"] == "addition" and quality["task_exact_match_reference"] >= 0.9
    assert (out / "COMPLETE").read_text().strip() == fp8_output["key"]
    assert {"modelopt", "torch", "transformers"} <= set(fp8_output["versions"])
    assert fp8_output["versions"]["modelopt"] == "0.47.0"
    assert {"load_s", "reference_s", "calibrate_s", "quality_s", "export_s"} <= set(fp8_output["timings_s"])


@pytest.mark.parametrize("output_name", ["fp8_output", "int4_output"])
def test_exports_keep_the_checkpoints_generation_settings(output_name, tiny_model_dir, request):
    """#62: exports gained ``"do_sample": true`` (ModelOpt sets it wherever transformers' default top_k is set) in a
    checkpoint that decodes greedily. Both the HF export and its BF16 fold hold the checkpoint's file unchanged."""
    out = Path(request.getfixturevalue(output_name)["out_dir"])
    source = (tiny_model_dir / "generation_config.json").read_bytes()
    assert b"do_sample" not in source
    assert (out / "hf" / "generation_config.json").read_bytes() == source
    assert (out / "hf-bf16" / "generation_config.json").read_bytes() == source


def test_an_export_of_a_checkpoint_without_generation_settings_has_none(tmp_path):
    from quantization.export import keep_generation_config

    source, export = tmp_path / "source", tmp_path / "export"
    source.mkdir(), export.mkdir()
    (export / "generation_config.json").write_text('{"do_sample": true}')
    keep_generation_config(source, export)
    assert not (export / "generation_config.json").exists()


def test_the_quality_report_keeps_no_warning_modelopt_gives_on_every_run(int4_output):
    """The CPU's fp32 calibration and transformers 4 make ModelOpt warn on every run; those say nothing of the model
    and stay out of the report, so what is there is about the model (the MoE case below)."""
    assert int4_output["quality"]["upstream_warnings"] == []


@pytest.mark.slow  # a MoE stand-in through int4-awq (a minute on two cores)
def test_modelopts_calibration_warnings_are_in_the_quality_report(tmp_path):
    """#62: ModelOpt's warnings that calibration never exercised a layer scrolled past in the worker's log and were
    in no report. Two sequences of 16 tokens route no token to some of a 16-expert MoE's experts."""
    out = _quantize(REPO_ROOT / "tests" / "data" / "standins" / "qwen3-moe", "int4-awq", tmp_path / "out",
                    "--samples", "2", "--seq-len", "16", "--batch-size", "2", "--formats", "hf")
    warned = out["quality"]["upstream_warnings"]
    assert any(w.startswith("UserWarning: awq_lite: Forcing pre_quant_scale=1 for model.layers.")
               and "not properly exercised during calibration" in w for w in warned), warned
    assert not any("differs from target dtype" in w for w in warned)


def test_int4_awq_exports_true_head_size_and_group_size(int4_output, tiny_model_dir):
    out = Path(int4_output["out_dir"])
    hf_config = json.loads((tiny_model_dir / "config.json").read_text())
    trtllm = json.loads((out / "trtllm" / "config.json").read_text())
    true_head = hf_config.get("head_dim") or hf_config["hidden_size"] // hf_config["num_attention_heads"]
    assert trtllm["head_size"] == true_head  # ModelOpt 0.47 writes half of it for packed INT4 weights
    assert trtllm["rotary_base"] == float(hf_config["rope_theta"])
    assert trtllm["quantization"] == {**trtllm["quantization"], "quant_algo": "W4A16_AWQ", "group_size": 128}
    hf_quant = json.loads((out / "hf" / "hf_quant_config.json").read_text())["quantization"]
    assert hf_quant["quant_algo"] == "W4A16_AWQ" and hf_quant["group_size"] == 128


def test_int8_smoothquant_exports_both_formats_and_folds_for_the_cpu(tiny_quantized, tmp_path):
    """int8-sq (SmoothQuant, per-channel weights) by ModelOpt on the CPU: both exports name the algorithm, the
    dequantised export reproduces the fake-quant model, and the cpu artefact folds it into plain BF16 weights."""
    int8 = tiny_quantized("int8-sq")
    out = Path(int8["out_dir"])
    hf_quant = json.loads((out / "hf" / "hf_quant_config.json").read_text())["quantization"]
    trtllm = json.loads((out / "trtllm" / "config.json").read_text())["quantization"]
    assert hf_quant["quant_algo"] == trtllm["quant_algo"] == "W8A8_SQ_PER_CHANNEL"
    quality = int8["quality"]
    assert quality["export_dequant_rel_err"] is not None
    assert quality["export_dequant_rel_err"] <= quality["logits_rel_err"] < 0.5
    built = run_cli("build", str(out), "--target", "cpu", "--kind", "hf-quantized", "--out", str(tmp_path / "cpu"),
                    "--json")
    assert built.returncode == 0, built.stderr[-2000:]
    assert json.loads(built.stdout)["lineage"]["recipe"] == "int8-sq"
    config = json.loads((tmp_path / "cpu" / "model" / "config.json").read_text())
    assert "quantization_config" not in config and config["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize("output_name", ["fp8_output", "int4_output"])
def test_dequantised_export_reproduces_fake_quant_within_report_error(output_name, request):
    quality = request.getfixturevalue(output_name)["quality"]
    assert quality["export_dequant_rel_err"] is not None
    assert quality["export_dequant_rel_err"] <= quality["logits_rel_err"]


def test_quantisation_error_shows_as_a_task_accuracy_drop(int4_output):
    quality = int4_output["quality"]
    assert quality["task_exact_match_quantized"] <= quality["task_exact_match_reference"]


def test_a_tensor_parallel_export_of_a_llama3_rope_model_writes_a_rank_file_per_rank_and_the_rope(tiny_model_dir,
                                                                                                   tmp_path):
    """One export of a copy of the tiny model given Llama-3's RoPE settings, at tp=2: a rank file per rank, and the
    RoPE base and scaling in the TensorRT-LLM config."""
    model = tmp_path / "llama3-rope"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["rope_theta"] = 500000.0
    config["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 128}
    (model / "config.json").write_text(json.dumps(config))
    result = _quantize(model, "fp8", tmp_path / "tp2", "--tp", "2", "--formats", "trtllm")
    trtllm_dir = Path(result["out_dir"]) / "trtllm"
    trtllm = json.loads((trtllm_dir / "config.json").read_text())
    assert trtllm["mapping"]["world_size"] == 2 and trtllm["mapping"]["tp_size"] == 2
    assert sorted(p.name for p in trtllm_dir.glob("rank*.safetensors")) == ["rank0.safetensors", "rank1.safetensors"]
    assert trtllm["rotary_base"] == 500000.0
    assert trtllm["rotary_scaling"]["rope_type"] == "llama3" and trtllm["rotary_scaling"]["factor"] == 8.0


def test_config_fix_reads_transformers5_rope_parameters(tmp_path):
    # transformers 5 moved rope_theta into rope_parameters; ModelOpt's hand-built config then lacks it.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"head_size": 32, "quantization": {}}))
    fixed = fix_trtllm_config(path, {"hidden_size": 128, "num_attention_heads": 2, "rope_parameters": {
        "rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0}})
    assert fixed["head_size"] == 64 and fixed["rotary_base"] == 500000.0
    assert fixed["rotary_scaling"] == {"rope_type": "llama3", "factor": 8.0}


def test_same_key_reuses_the_output_and_another_key_is_never_overwritten(fp8_output, tiny_model_dir):
    out = Path(fp8_output["out_dir"])
    again = run_cli("quantize", str(tiny_model_dir), "--recipe", "fp8", "--out", str(out), *SMALL,
                    "--task", "addition", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["key"] == fp8_output["key"]
    before = (out / "hf" / "model.safetensors").stat().st_mtime_ns
    other = run_cli("quantize", str(tiny_model_dir), "--recipe", "int4-awq", "--out", str(out), *SMALL)
    assert other.returncode == 2 and "not overwritten" in other.stderr
    assert (out / "hf" / "model.safetensors").stat().st_mtime_ns == before


def test_unknown_recipe_lists_known_ones(tiny_model_dir):
    result = run_cli("quantize", str(tiny_model_dir), "--recipe", "fp3")
    assert result.returncode == 2 and "unknown recipe 'fp3'" in result.stderr and "int4-awq" in result.stderr


def test_bad_calibration_sets_are_refused(tiny_model_dir, tmp_path):
    """Through the CLI, a set too short for the samples asked: exit 2 with the reason, nothing marked complete, and
    found before the weights are loaded (here they are truncated, and loading them would fail first: for a large
    model, minutes lost). A missing and an empty set are refused by the same loader, asked directly."""
    from transformers import AutoTokenizer

    from quantization.calibration import load_calibration

    (tmp_path / "empty.txt").write_text("\n")
    (tmp_path / "short.txt").write_text("1+1=2\n")
    model_dir = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = run_cli("quantize", str(model_dir), "--recipe", "fp8", "--out", str(tmp_path / "out"),
                     "--calibration", str(tmp_path / "short.txt"), *SMALL)
    assert result.returncode == 2, result.stderr
    assert "fewer than the 16" in result.stderr and "calibration.dataset" in result.stderr
    assert not (tmp_path / "out" / "COMPLETE").exists()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for name, message in (("missing.txt", "calibration file not found"), ("empty.txt", "is empty")):
        with pytest.raises(UserError, match=message):
            load_calibration(str(tmp_path / name), tokenizer, samples=16, seq_len=32, batch_size=8)


def test_interrupted_run_leaves_no_marker_and_rerun_starts_clean(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "enginesmith", "quantize", str(tiny_model_dir), "--recipe", "int4-awq",
               "--out", str(out), *SMALL]
    log = tmp_path / "first.log"
    with log.open("w") as output:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT)
    staging = out.with_name("out.partial")
    kill_when(process, staging.exists, "the run working in out.partial", timeout_s=LONG_WAIT_S, log=log)
    assert not (out / "COMPLETE").exists()
    finished = run_cli("quantize", str(tiny_model_dir), "--recipe", "int4-awq", "--out", str(out), *SMALL)
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert (out / "COMPLETE").is_file() and not staging.exists()


def test_two_processes_on_one_output_do_not_clash_the_second_waits_and_reuses(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "enginesmith", "quantize", str(tiny_model_dir), "--recipe", "int4-awq",
               "--out", str(out), *SMALL, "--json"]
    outputs = {name: (tmp_path / f"{name}.out", tmp_path / f"{name}.err") for name in ("first", "second")}

    def start(name: str) -> subprocess.Popen[bytes]:
        stdout, stderr = outputs[name]
        with stdout.open("w") as out_file, stderr.open("w") as err_file:
            return subprocess.Popen(command, cwd=REPO_ROOT, stdout=out_file, stderr=err_file)

    first = start("first")
    processes = [first]
    try:
        # The first is stopped while it works in out.partial (inside the output lock): it cannot finish before
        # the second has found the lock held, which the second says before it waits.
        pause_when(first, out.with_name("out.partial").exists, "the first run working in out.partial",
                   timeout_s=LONG_WAIT_S, log=outputs["first"][1])
        second = start("second")
        processes.append(second)
        wait_for(lambda: "another process is producing" in outputs["second"][1].read_text(),
                 "the second run to wait for the first", timeout_s=LONG_WAIT_S, process=second,
                 log=outputs["second"][1])
        resume(first)
        codes = [process.wait(timeout=600) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    (first_stdout, first_stderr), (second_stdout, second_stderr) = (
        (stdout.read_text(), stderr.read_text()) for stdout, stderr in outputs.values())
    assert codes == [0, 0], (first_stderr[-2000:], second_stderr[-2000:])
    assert json.loads(second_stdout) == json.loads(first_stdout)
    assert (out / "COMPLETE").is_file() and not out.with_name("out.partial").exists()


def test_memory_estimate_refuses_with_the_numbers(tiny_model_dir):
    from quantization.stage import _check_memory

    huge = local_checkpoint(tiny_model_dir).model_copy(update={"parameter_count": 10**13})
    with pytest.raises(UserError) as caught:
        _check_memory(huge, "cpu", {"torch_dtype": "bfloat16", "vocab_size": 262144}, seq_len=256, passthrough=False)
    assert "GiB" in caught.value.message and "in fp32" in caught.value.message
    assert "of held-out logits" in caught.value.message


def test_recipes_map_to_modelopt_configs():
    from quantization.recipes import modelopt_config

    catalogue = default_catalogue()
    for recipe in catalogue.recipes.values():
        if recipe.is_passthrough:
            continue
        config = modelopt_config(recipe, awq_block_size=64 if recipe.awq_block_size else None)
        names = [entry.get("quantizer_name") for entry in config["quant_cfg"]]
        assert "*weight_quantizer" in names
        if recipe.kv_cache == "fp8":
            assert any("bmm_quantizer" in str(n) for n in names)
        if recipe.awq_block_size:
            weight = next(e for e in config["quant_cfg"] if e.get("quantizer_name") == "*weight_quantizer")
            cfgs = weight["cfg"] if isinstance(weight["cfg"], list) else [weight["cfg"]]
            assert any(c.get("block_sizes", {}).get(-1) == 64 for c in cfgs)


def test_upstream_errors_name_the_step_but_a_full_disk_stays_what_it_is():
    """A library's error inside a step becomes a UserError naming the step and model; running out of disk or
    device memory is the machine's problem, not the model's, and passes through unchanged."""
    import errno

    from quantization.stage import _upstream_errors

    with pytest.raises(UserError) as caught, _upstream_errors("export", "org/model", "ModelOpt", "try fp8"):
        raise NotImplementedError("Cannot pack weight with input dimension 576 and block size 128")
    assert "quantize/export of org/model failed in ModelOpt" in str(caught.value)
    assert caught.value.where == "quantize/export"
    with pytest.raises(OSError) as disk, _upstream_errors("export", "org/model", "ModelOpt", "try fp8"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert not isinstance(disk.value, UserError) and disk.value.errno == errno.ENOSPC


@pytest.mark.slow
def test_the_cli_runs_a_planned_cell_under_the_plans_keys(tmp_path: Path) -> None:
    """#15 finding 7: ``quantize``/``build`` with ``--config --cell`` run the stage the nightly runs, under the plan's
    keys (the CLI derived its own keys from the installed versions before); a quantised output of another cell is
    refused by ``build`` naming both keys."""
    from pipeline.common.plan_sources import plan_config

    config = write_tiny_matrix(tmp_path)
    _, plan = plan_config(config, default_catalogue())
    cells = {c.recipe.id: c for c in plan.cells}
    fp8, int4 = cells["fp8"], cells["int4-awq"]

    quantized = run_cli("quantize", "--config", str(config), "--cell", fp8.id, "--json", timeout_s=900)
    assert quantized.returncode == 0, quantized.stderr[-2000:]
    result = json.loads(quantized.stdout)
    assert result["key"] == fp8.stage_keys.quantize
    assert Path(result["out_dir"]).parent == tmp_path / "work" / "quantized"

    built = run_cli("build", result["out_dir"], "--config", str(config), "--cell", fp8.id, "--json")
    assert built.returncode == 0, built.stderr[-2000:]
    assert json.loads(built.stdout)["key"] == fp8.stage_keys.build

    # Validation of the cell as the nightly wires it: the config's workload (the orchestration tests' one round), the
    # cell's resolved profile for the reference, the report where the nightly writes it. Its gates here ask for a
    # candidate 50 times faster than its reference (a gate and the workload enter only the validation key, so the
    # cell's quantize and build outputs are the ones above): the verdict is FAILED, and a job gating on the command
    # stops. Hugging Face's own server (`transformers serve`) on the BF16 checkpoint is measured beside both sides
    # as an ungated baseline.
    needs_vllm_cpu()
    import yaml

    strict = yaml.safe_load(config.read_text())
    strict["gates"] = {**strict["gates"], "min_throughput_ratio": 50.0}
    strict["workload"] = {**strict["workload"], "baselines": ["transformers-serve"]}
    strict_config = config.with_name("strict.yaml")
    strict_config.write_text(yaml.safe_dump(strict, sort_keys=False))
    strict_cell = {c.recipe.id: c for c in plan_config(strict_config, default_catalogue())[1].cells}["fp8"]
    assert strict_cell.stage_keys.build == fp8.stage_keys.build
    validated = run_cli("validate", "--config", str(strict_config), "--cell", fp8.id, "--json", timeout_s=1200)
    assert validated.returncode == 1, validated.stdout[-2000:] + validated.stderr[-3000:]
    report = json.loads(validated.stdout)
    assert report["recipe"] == "fp8" and report["workload"]["name"] == "tiny-addition-flow"
    assert not report["passed"] and [g["name"] for g in report["gates"] if not g["passed"]] == ["min_throughput_ratio"]
    reports = tmp_path / "work" / "reports" / strict_cell.stage_keys.validation[:16]
    assert (reports / "report.json").is_file()
    [baseline] = report["comparison"]["baselines"]
    assert (baseline["role"], baseline["runtime"]) == ("baseline", "transformers-serve")
    assert {lv["concurrency"] for lv in baseline["levels"]} == {1} and baseline["peak_memory_bytes"] > 0
    assert all(lv["completed"] > 0 and lv["failed"] == 0 for lv in baseline["levels"])
    assert baseline["accuracy"] == [] and baseline["perplexity"] is None  # ungated: measured for speed only
    assert "transformers-serve" in (reports / "report.md").read_text()

    refused = run_cli("build", result["out_dir"], "--config", str(config), "--cell", int4.id)
    assert refused.returncode == 2
    assert fp8.stage_keys.quantize[:12] in refused.stderr and int4.stage_keys.quantize[:12] in refused.stderr
    mixed = run_cli("quantize", "--config", str(config), "--cell", fp8.id, "--recipe", "fp8")
    assert mixed.returncode == 2 and "--recipe" in mixed.stderr


def test_a_stage_refuses_a_toolchain_other_than_its_keys(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The quantize key names the configured toolchain; an environment with another ModelOpt is refused before any
    work, naming both versions, and leaves nothing behind."""
    from quantization.stage import QuantizeRequest, installed_versions, quantize_checkpoint

    here = installed_versions()["modelopt"]
    request = QuantizeRequest(checkpoint=local_checkpoint(tiny_model_dir), recipe=default_catalogue().recipe("fp8"),
                              key="k" * 64, out_dir=str(tmp_path / "out"), formats=["hf"],
                              expected_versions={"modelopt": "0.37.0", "tensorrt_llm": "1.2.1"})
    with pytest.raises(UserError) as caught:
        quantize_checkpoint(request)
    assert "0.37.0" in caught.value.message and here in caught.value.message
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_a_model_accelerate_offloaded_is_refused_by_name_before_calibration(tiny_model_dir: Path,
                                                                             tmp_path: Path) -> None:
    """What ``device_map="auto"`` does when the GPUs' memory runs out: some modules on the CPU or disk, their
    weights on the meta device, which ModelOpt's TensorRT-LLM export and the BF16 cast cannot handle. The load
    here is accelerate's real dispatch, with the last decoder layer offloaded to disk (a device map as "auto"
    computes it when the devices are full)."""
    import torch
    from transformers import AutoModelForCausalLM

    from quantization.stage import refuse_offloaded

    layers = json.loads((tiny_model_dir / "config.json").read_text())["num_hidden_layers"]
    device_map = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu",
                  **{f"model.layers.{i}": "cpu" for i in range(layers - 1)}, f"model.layers.{layers - 1}": "disk"}
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32, device_map=device_map,
                                                 offload_folder=str(tmp_path / "off"))
    on_disk = sorted(name for name, where in model.hf_device_map.items() if where == "disk")
    assert on_disk == [f"model.layers.{layers - 1}"]
    assert any(p.is_meta for p in model.parameters())  # what ModelOpt's export and the cast cannot take
    with pytest.raises(UserError, match="does not fit in the visible GPUs' free memory") as raised:
        refuse_offloaded(model, "tiny-llama")
    assert f"{on_disk[0]} on disk" in str(raised.value) and raised.value.where == "quantize/load"
    assert "quantize_on" in (raised.value.hint or "")
    # A model loaded without a device map (the CPU path) passes.
    refuse_offloaded(AutoModelForCausalLM.from_pretrained(tiny_model_dir), "tiny-llama")


@pytest.mark.parametrize(("agreement", "stops"), [(0.12, True), (0.95, False)])
def test_a_quantise_report_far_below_the_recipe_stops_the_cell_before_validation(agreement, stops):
    """#49: fp8 passed with 18.8 % greedy agreement on a random-weight model, and int4 went on to validation at any
    quality. A top-1 agreement with BF16 under gates.min_quantize_agreement (per recipe, default 30 %) stops the
    cell before build and validation, naming the report."""
    from types import SimpleNamespace

    from enginesmith.core.artefacts import QualityReport
    from enginesmith.core.config import default_catalogue
    from enginesmith.core.errors import UserError
    from pipeline.common.plan_sources import plan_config
    from pipeline.kinds.llm_steps import check_quantize_quality
    from tests.conftest import CONFIGS

    config, plan = plan_config(CONFIGS / "examples" / "tiny-cpu.yaml", default_catalogue(), resolve_hub=False)
    cell = next(c for c in plan.cells if c.recipe.id == "int4-awq")
    quality = QualityReport.model_construct(logits_rel_err=0.5, top1_agreement=agreement)
    quantized = SimpleNamespace(quality=quality, out_dir="/work/quantized/abc")
    if not stops:
        check_quantize_quality(cell, quantized, config)  # type: ignore[arg-type]
        return
    with pytest.raises(UserError) as caught:
        check_quantize_quality(cell, quantized, config)  # type: ignore[arg-type]
    assert "12.0%" in caught.value.message and "below 30%" in caught.value.message
    assert "stopped before build and validation" in caught.value.message
    lenient = config.model_copy(update={"gates": config.gates.model_copy(update={
        "min_quantize_agreement": {"int4-awq": 0.1}})})
    check_quantize_quality(cell, quantized, lenient)  # type: ignore[arg-type]
