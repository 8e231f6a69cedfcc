"""The ``trtllm-engine`` kind: run ``trtllm-build`` on the TensorRT-LLM checkpoint and verify what it wrote.

The engine's own ``config.json`` records the TensorRT-LLM version and the build config, but not TensorRT,
CUDA, the driver or the GPU: the caller records those in the artefact.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builders.failures import explain_failure
from builders.toolchain import toolchain_versions
from builders.trtllm_args import trtllm_build_argv
from enginesmith.core.artefacts import QuantizedCheckpoint
from enginesmith.core.checkpoints.files import TOKENIZER_FILES
from enginesmith.core.compat import modelopt_pin_problem
from enginesmith.core.errors import UserError
from enginesmith.core.process import run_logged
from enginesmith.core.runtimes import release_matches, tool_path
from enginesmith.core.specs import BuildProfile, TargetSpec

DEFAULT_BUILD_TIMEOUT_S = 4 * 3600


@dataclass(frozen=True)
class EngineToolchain:
    """The ``trtllm-build`` a build runs and the versions installed in its environment (TensorRT-LLM, TensorRT,
    torch), already checked against the pins the build key names."""

    executable: Path
    versions: dict[str, str]


def engine_toolchain(
    quantized: QuantizedCheckpoint,
    *,
    expected_trtllm_version: str,
    expected_tensorrt_version: str | None = None,
) -> EngineToolchain:
    """Check that ``quantized`` can go to this node's ``trtllm-build``: it has a TensorRT-LLM export, written by a
    ModelOpt that version reads, and the TensorRT-LLM runtime environment is there with the pinned TensorRT-LLM and
    TensorRT. Writes nothing, so a build checks this before it makes its staging directory. Raises a UserError naming
    the cause and what to do."""
    if "trtllm" not in quantized.formats or not quantized.trtllm_dir.is_dir():
        raise UserError("the quantised checkpoint has no TensorRT-LLM export", where=quantized.out_dir,
                        hint="quantise with --formats trtllm (inside the TensorRT-LLM image)")
    executable, environment = tool_path("trtllm-build")
    versions = toolchain_versions(executable, environment.environment.versions or None)
    installed = versions.get("tensorrt_llm")
    rebuild = (f"make the environment from the catalogue's runtimes/{environment.environment.requirements} "
               f"({environment.environment.setup_command})")
    if installed != expected_trtllm_version:
        raise UserError(
            f"trtllm-build at {executable} ({environment.describe()}) is TensorRT-LLM {installed or 'unknown'}, the "
            f"config pins {expected_trtllm_version}", where="toolchains.trtllm.tensorrt_llm",
            hint=f"{rebuild}; an engine runs only with the version that built it")
    installed_tensorrt = versions.get("tensorrt")
    if expected_tensorrt_version and not release_matches(installed_tensorrt or "", expected_tensorrt_version):
        raise UserError(
            f"trtllm-build at {executable} ({environment.describe()}) runs TensorRT {installed_tensorrt or 'unknown'}, "
            f"the config pins {expected_tensorrt_version}", where="toolchains.trtllm.tensorrt",
            hint=f"{rebuild}; an engine runs only with the TensorRT that built it")
    exporter = quantized.versions.get("modelopt", "unknown")
    problem = modelopt_pin_problem(expected_trtllm_version, exporter) if quantized.quant_algo else None
    if problem:
        raise UserError(f"this checkpoint was {problem}", where=str(Path(quantized.out_dir) / "quantize.json"),
                        hint="quantise engine cells inside the pinned TensorRT-LLM image, whose ModelOpt writes the "
                             "checkpoint layout its trtllm-build reads")
    return EngineToolchain(executable=executable, versions=versions)


def build_engine(
    quantized: QuantizedCheckpoint,
    target: TargetSpec,
    profile: BuildProfile,
    staging: Path,
    toolchain: EngineToolchain,
    *,
    timeout_s: float = DEFAULT_BUILD_TIMEOUT_S,
) -> tuple[dict[str, str], dict[str, Any]]:
    """Build the engine into ``staging/engine`` (tokenizer in ``staging/tokenizer``) with ``toolchain``'s
    ``trtllm-build`` (from ``engine_toolchain``); returns the versions installed beside it and the engine's recorded
    build config. Raises a UserError naming the cause on any failure."""
    assert target.sm is not None
    executable, versions = toolchain.executable, toolchain.versions
    installed = versions["tensorrt_llm"]
    engine_dir = staging / "engine"
    world_size = quantized.tp * quantized.pp
    argv = trtllm_build_argv(quantized.trtllm_dir, engine_dir, profile, quant_algo=quantized.quant_algo,
                             sm=target.sm, world_size=world_size, executable=str(executable))
    result = run_logged(argv, staging / "logs" / "trtllm-build.log", timeout_s=timeout_s)
    if result.timed_out:
        raise UserError(f"trtllm-build did not finish within {timeout_s:.0f} s; it was stopped",
                        where=str(result.log_path), hint="raise the build timeout, or lower the profile's limits")
    if result.returncode != 0:
        known = explain_failure(result.log_path.read_text(errors="replace"))
        what, hint = known or (f"trtllm-build exited with status {result.returncode}", "read the build log")
        raise UserError(f"{what}\n--- last lines of the build log ---\n{result.log_tail()}",
                        where=str(result.log_path), hint=hint)
    engine_config = verify_engine_dir(engine_dir, world_size=world_size, expected_version=installed)
    tokenizer_dir = staging / "tokenizer"
    tokenizer_dir.mkdir()
    tokenizer_source = quantized.hf_dir if quantized.hf_dir.is_dir() else Path(quantized.source.local_path)
    for name in TOKENIZER_FILES:
        if (tokenizer_source / name).is_file():
            shutil.copyfile(tokenizer_source / name, tokenizer_dir / name)
    return versions, dict(engine_config.get("build_config", {}))


def verify_engine_dir(engine_dir: Path, *, world_size: int, expected_version: str) -> dict[str, Any]:
    """config.json exists and names the expected TensorRT-LLM version and world size; one rank file per rank."""
    config_path = engine_dir / "config.json"
    if not config_path.is_file():
        raise UserError("trtllm-build exited 0 but wrote no config.json", where=str(engine_dir))
    config = json.loads(config_path.read_text())
    if config.get("version") != expected_version:
        raise UserError(f"engine config.json says TensorRT-LLM {config.get('version')!r}, the build ran "
                        f"{expected_version}", where=str(config_path))
    mapping = config.get("pretrained_config", {}).get("mapping", {})
    if mapping.get("world_size", 1) != world_size:
        raise UserError(f"engine mapping {mapping} is not world size {world_size}", where=str(config_path))
    missing = [f"rank{r}.engine" for r in range(world_size) if not (engine_dir / f"rank{r}.engine").is_file()]
    if missing:
        raise UserError(f"trtllm-build exited 0 but {', '.join(missing)} is missing", where=str(engine_dir),
                        hint="read the build log; the engine is not usable")
    return dict(config)
