"""The ``tensorrt-engine`` kind for encoder (embedding) models: run NVIDIA's ``trtexec`` on an ONNX graph and check
what it wrote.

TensorRT 11 builds strongly typed networks only: ``--int8``, ``--fp16``, ``--best`` and ``--calib`` are gone from
trtexec, so the precision is the graph's own (its tensor types and ModelOpt's explicit Q/DQ nodes); nothing here
chooses one. The caller checks the GPU; this module only runs the process and reads its output.

Flags and output checked against NVIDIA/TensorRT at the TensorRT 11.1 OSS release (a892d22, 2026-07), the newest
source available here: ``samples/common/sampleOptions.cpp`` (``--onnx``, ``--saveEngine``, ``--minShapes``,
``--optShapes``, ``--maxShapes`` as ``name:AxB[,name:AxB]``, ``--skipInference``; ``--stronglyTyped`` is still
accepted there, documented as a deprecated no-op because strong typing is the default; ``--int8`` and ``--fp16``
are parsed only by the safety builder's options, so plain trtexec reports them as ``Unknown option``),
``samples/common/logging.h`` (the first line, ``&&&& RUNNING TensorRT.trtexec [TensorRT v<NV_TENSORRT_VERSION>]
[b<build>] # <command line>``, printed before the options are parsed, so ``trtexec --help`` prints it too) and
``include/NvInferRuntimeBase.h`` (``NV_TENSORRT_VERSION`` = major * 10000 + minor * 100 + patch: v110400 is 11.4.0).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from pydantic import BaseModel

from enginesmith.core.errors import TransientError, UserError
from enginesmith.core.process import run_logged

TRTEXEC_ENV = "ENGINESMITH_TRTEXEC"
ENGINE_FILE = "model.plan"
LOG_FILE = "trtexec.log"
DEFAULT_BUILD_TIMEOUT_S = 3600.0
VERSION_PROBE_TIMEOUT_S = 120.0
# Always passed: strong typing (TensorRT 11's only mode, named so an older trtexec builds the same way) and no
# timing run after the build, which would need inputs and tell us nothing about the engine file.
BUILD_FLAGS = ("--stronglyTyped", "--skipInference")
_BANNER = re.compile(r"&&&& RUNNING TensorRT\.trtexec \[TensorRT v(\d+(?:\.\d+)*)\]")


class TrtexecBuild(BaseModel):
    """What one ``trtexec`` build wrote into its output directory."""

    engine_file: str
    """File name of the serialized engine inside the output directory (``model.plan``)."""
    versions: dict[str, str]
    """``{"tensorrt": "11.4.0"}``, as trtexec's own first line reports it."""
    build_config: dict[str, object]
    """``shapes`` (min/opt/max per input), ``flags``, ``argv`` (file names, no absolute paths) and
    ``build_seconds``."""


def trtexec_path() -> str:
    """The ``trtexec`` to run: ``$ENGINESMITH_TRTEXEC``, else ``trtexec`` on PATH. Raises a UserError naming
    ENGINESMITH_TRTEXEC when neither is an executable."""
    override = os.environ.get(TRTEXEC_ENV)
    if override:
        path = Path(override).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise UserError(f"{TRTEXEC_ENV}={override} is not an executable file", where=TRTEXEC_ENV,
                            hint="point it at the trtexec of the pinned TensorRT (e.g. /usr/src/tensorrt/bin/trtexec)")
        return str(path.absolute())
    found = shutil.which("trtexec")
    if found is None:
        raise UserError("trtexec is not on PATH and ENGINESMITH_TRTEXEC is not set", where=TRTEXEC_ENV,
                        hint="set ENGINESMITH_TRTEXEC to the trtexec of the pinned TensorRT "
                             "(e.g. /usr/src/tensorrt/bin/trtexec in NVIDIA's TensorRT image), or put it on PATH")
    return found


def trtexec_argv(
    onnx_path: Path,
    engine_path: Path,
    *,
    input_names: list[str],
    max_batch: int,
    max_seq_length: int,
    opt_batch: int,
    opt_seq_length: int,
) -> list[str]:
    """The ``trtexec`` command line (``argv[0]`` is ``trtexec``) that builds ``engine_path`` from ``onnx_path`` with
    one optimisation profile: every input ``[batch, seq]`` from 1x1 through opt to max. Raises a UserError for an
    empty or malformed input list or a profile that is not 1 <= opt <= max."""
    if not input_names:
        raise UserError("no encoder inputs named", where="input_names",
                        hint="name the graph's inputs, e.g. input_ids and attention_mask")
    bad = [name for name in input_names if not name or any(c in name for c in ",:= ")]
    if bad or len(set(input_names)) != len(input_names):
        raise UserError(f"input names {input_names} are not distinct names trtexec can parse", where="input_names",
                        hint="names must be unique and free of ',', ':', '=' and spaces")
    for axis, opt, maximum in (("batch", opt_batch, max_batch), ("seq_length", opt_seq_length, max_seq_length)):
        if not 1 <= opt <= maximum:
            raise UserError(f"the {axis} profile must satisfy 1 <= opt ({opt}) <= max ({maximum})",
                            where=f"max_{axis}", hint="raise the max or lower the opt value")

    def spec(batch: int, seq: int) -> str:
        return ",".join(f"{name}:{batch}x{seq}" for name in input_names)

    return [
        "trtexec", f"--onnx={onnx_path}", f"--saveEngine={engine_path}", BUILD_FLAGS[0],
        f"--minShapes={spec(1, 1)}", f"--optShapes={spec(opt_batch, opt_seq_length)}",
        f"--maxShapes={spec(max_batch, max_seq_length)}", *BUILD_FLAGS[1:],
    ]


def tensorrt_version_from_output(output: str) -> str | None:
    """The TensorRT version on trtexec's ``&&&& RUNNING TensorRT.trtexec [TensorRT v110400]`` line, as
    ``major.minor.patch`` ("11.4.0"), or None when no such line is there. TensorRT 10 and later encode
    major * 10000 + minor * 100 + patch; TensorRT 8 and earlier major * 1000 + minor * 100 + patch (v8601)."""
    match = _BANNER.search(output)
    if match is None:
        return None
    raw = match.group(1)
    if "." in raw:
        return ".".join(raw.split(".")[:3])
    code = int(raw)
    if code >= 100000:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])


def probe_tensorrt_version(trtexec: str) -> str:
    """The TensorRT version of ``trtexec``, read from the first line of ``trtexec --help`` (printed before any
    option is parsed and without touching a GPU). Raises a UserError when it does not run or prints no version."""
    try:
        probe = subprocess.run([trtexec, "--help"], capture_output=True, text=True, errors="replace",
                               timeout=VERSION_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UserError(f"could not run {trtexec} --help: {exc}", where=trtexec,
                        hint=f"check the file, or set {TRTEXEC_ENV} to a working trtexec") from exc
    output = probe.stdout + probe.stderr
    version = tensorrt_version_from_output(output)
    if version is None:
        tail = "\n".join(output.splitlines()[-10:])
        raise UserError(f"{trtexec} --help (status {probe.returncode}) printed no '&&&& RUNNING TensorRT.trtexec "
                        f"[TensorRT v...]' line, so its TensorRT version is unknown\n--- last lines ---\n{tail}",
                        where=trtexec, hint=f"set {TRTEXEC_ENV} to NVIDIA's trtexec")
    return version


def build_tensorrt_encoder(
    onnx_path: Path,
    out_dir: Path,
    *,
    input_names: list[str],
    max_batch: int,
    max_seq_length: int,
    expected_tensorrt: str,
    timeout_s: float = DEFAULT_BUILD_TIMEOUT_S,
    opt_batch: int | None = None,
    opt_seq_length: int | None = None,
    log_path: Path | None = None,
) -> TrtexecBuild:
    """Build ``out_dir/model.plan`` from ``onnx_path`` with trtexec, logging to ``log_path`` (default
    ``out_dir/trtexec.log``; a caller that deletes ``out_dir`` on failure logs elsewhere).

    The opt shape defaults to the max shape (TensorRT picks its kernels for the opt shape; batched embedding is
    throughput work). Before anything is written, refuses a trtexec whose TensorRT major.minor is not
    ``expected_tensorrt``'s: an engine runs only on the TensorRT release that built it. Raises a UserError for that,
    a missing trtexec or graph, a failed build (with the log's last lines) and an rc-0 build without an engine file;
    a TransientError when the build outlives ``timeout_s``."""
    if not onnx_path.is_file():
        raise UserError("ONNX graph not found", where=str(onnx_path), hint="export the encoder to ONNX first")
    opt_b = max_batch if opt_batch is None else opt_batch
    opt_s = max_seq_length if opt_seq_length is None else opt_seq_length

    def argv_for(onnx: Path, engine: Path) -> list[str]:
        return trtexec_argv(onnx, engine, input_names=input_names, max_batch=max_batch,
                            max_seq_length=max_seq_length, opt_batch=opt_b, opt_seq_length=opt_s)

    engine_path = out_dir / ENGINE_FILE
    argv = argv_for(onnx_path.absolute(), engine_path.absolute())
    recorded_argv = argv_for(Path(onnx_path.name), Path(ENGINE_FILE))
    trtexec = trtexec_path()
    seen = probe_tensorrt_version(trtexec)
    if _major_minor(seen) != _major_minor(expected_tensorrt):
        raise UserError(
            f"{trtexec} is TensorRT {seen}, the build expects TensorRT {expected_tensorrt} (major.minor must match)",
            where=trtexec,
            hint=f"set {TRTEXEC_ENV} to the trtexec of TensorRT {'.'.join(_major_minor(expected_tensorrt))}, or pin "
                 f"TensorRT {'.'.join(_major_minor(seen))}; an engine runs only on the TensorRT release that built it")

    out_dir.mkdir(parents=True, exist_ok=True)
    engine_path.unlink(missing_ok=True)  # a stale engine must not pass for this build's
    started = time.monotonic()
    result = run_logged([trtexec, *argv[1:]], log_path or out_dir / LOG_FILE, timeout_s=timeout_s)
    build_seconds = round(time.monotonic() - started, 3)
    if result.timed_out:
        raise TransientError(f"trtexec did not finish within {timeout_s:.0f} s; it was stopped",
                             where=str(result.log_path), hint="raise the build timeout, or lower max_batch / "
                                                              "max_seq_length")
    if result.returncode != 0:
        raise UserError(f"trtexec exited with status {result.returncode}\n--- last lines of {result.log_path} ---\n"
                        f"{result.log_tail()}", where=str(result.log_path),
                        hint="read the build log; an 'Unknown option' or ONNX parser error names the cause")
    if not engine_path.is_file():
        raise UserError(f"trtexec exited 0 but wrote no {ENGINE_FILE}", where=str(out_dir),
                        hint=f"read {result.log_path}; the build did not produce an engine")
    built_with = tensorrt_version_from_output(result.log_path.read_text(errors="replace")) or seen
    return TrtexecBuild(
        engine_file=ENGINE_FILE,
        versions={"tensorrt": built_with},
        build_config={
            "shapes": {name: {"min": [1, 1], "opt": [opt_b, opt_s], "max": [max_batch, max_seq_length]}
                       for name in input_names},
            "flags": list(BUILD_FLAGS),
            "argv": recorded_argv,
            "build_seconds": build_seconds,
        },
    )
