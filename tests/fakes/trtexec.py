# TEST DOUBLE: this is not NVIDIA's trtexec and builds no TensorRT engine. Tests only.
"""TEST DOUBLE for NVIDIA's ``trtexec`` (TensorRT 11.x), at the process boundary we cannot cross here: the real
tool needs an NVIDIA GPU and TensorRT, neither of which exist on this machine.

It prints trtexec's first line, ``&&&& RUNNING TensorRT.trtexec [TensorRT v<version>] [b<build>] # <command>``
(``FAKE_TRTEXEC_VERSION``, default 110400 = 11.4.0), also for ``--help``, and then checks what the real tool would
refuse, as strictly as builders/tensorrt_encoder.py's command needs:

- only ``--onnx``, ``--saveEngine``, ``--minShapes``, ``--optShapes``, ``--maxShapes``, ``--stronglyTyped``,
  ``--skipInference`` and ``--help``; anything else is ``Unknown option`` (status 1), as in real trtexec, and
  ``--int8``, ``--fp16``, ``--best``, ``--calib`` say they were removed in TensorRT 11;
- ``--stronglyTyped`` is required (TensorRT 11 treats it as a no-op; the double insists so the command states it);
- ``--onnx`` must load and pass ``onnx.checker.check_model``;
- the three shape specs must name exactly the graph's inputs, with each input's rank, its fixed dims, and
  min <= opt <= max in every dim.

The "engine" it writes is JSON naming this double, the graph's sha256, the shapes and the version: plainly not a
TensorRT plan. ``FAKE_TRTEXEC_FAIL`` injects faults: ``no-engine`` (status 0, nothing written), ``hang``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

VALUE_OPTIONS = ("--onnx", "--saveEngine", "--minShapes", "--optShapes", "--maxShapes")
SWITCHES = ("--stronglyTyped", "--skipInference")
REMOVED_IN_TRT11 = ("--int8", "--fp16", "--best", "--calib")
SHAPE_OPTIONS = ("--minShapes", "--optShapes", "--maxShapes")


class Refused(Exception):
    """What real trtexec would print as an error before exiting with status 1."""


def version_code() -> int:
    return int(os.environ.get("FAKE_TRTEXEC_VERSION", "110400"))


def dotted(code: int) -> str:
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def parse(argv: list[str]) -> tuple[dict[str, str], set[str]]:
    values: dict[str, str] = {}
    switches: set[str] = set()
    for arg in argv:
        name, has_value, value = arg.partition("=")
        if name in REMOVED_IN_TRT11:
            raise Refused(f"Unknown option: {arg} ({name} was removed in TensorRT 11: networks are strongly typed, "
                          "precision comes from the graph's types and explicit Q/DQ)")
        if name in VALUE_OPTIONS and has_value and value:
            if name in values:
                raise Refused(f"{name} given twice")
            values[name] = value
        elif name in SWITCHES and not has_value:
            switches.add(name)
        else:
            raise Refused(f"Unknown option: {arg}")
    return values, switches


def parse_shapes(option: str, spec: str) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for item in spec.split(","):
        name, _, dims = item.rpartition(":")
        try:
            shape = [int(dim) for dim in dims.split("x")]
        except ValueError:
            raise Refused(f"{option}: cannot parse {item!r} (expected name:AxB)") from None
        if not name or name in shapes or any(dim < 1 for dim in shape):
            raise Refused(f"{option}: bad or repeated entry {item!r}")
        shapes[name] = shape
    return shapes


def graph_inputs(onnx_path: Path) -> dict[str, list[int | None]]:
    """The graph's real inputs (not initializers), each dim fixed (int) or dynamic (None). Raises Refused when the
    file does not load or fails the ONNX checker, as trtexec's ONNX parser would."""
    import onnx

    if not onnx_path.is_file():
        raise Refused(f"Cannot open ONNX file: {onnx_path}")
    try:
        model = onnx.load(str(onnx_path))
        onnx.checker.check_model(model)
    except Exception as exc:
        raise Refused(f"[TRT] ModelImporter: failed to parse ONNX model {onnx_path}: {type(exc).__name__}: {exc}\n"
                      "Failed to parse onnx file") from None
    initializers = {init.name for init in model.graph.initializer}
    return {
        value.name: [dim.dim_value if dim.HasField("dim_value") else None
                     for dim in value.type.tensor_type.shape.dim]
        for value in model.graph.input if value.name not in initializers
    }


def check_profile(inputs: dict[str, list[int | None]], profile: dict[str, dict[str, list[int]]]) -> None:
    for option, shapes in profile.items():
        if set(shapes) != set(inputs):
            raise Refused(f"{option} names {sorted(shapes)}, the network's inputs are {sorted(inputs)}")
    for name, dims in inputs.items():
        low, opt, high = (profile[option][name] for option in SHAPE_OPTIONS)
        if not len(low) == len(opt) == len(high) == len(dims):
            raise Refused(f"{name}: the profile's ranks {len(low)}/{len(opt)}/{len(high)} are not the input's "
                          f"rank {len(dims)}")
        for axis, (fixed, lo, mid, hi) in enumerate(zip(dims, low, opt, high, strict=True)):
            if not lo <= mid <= hi:
                raise Refused(f"{name} dim {axis}: min {lo} <= opt {mid} <= max {hi} does not hold")
            if fixed is not None and not lo == mid == hi == fixed:
                raise Refused(f"{name} dim {axis} is fixed at {fixed} in the graph, the profile asks {lo}..{hi}")


def build(values: dict[str, str], switches: set[str]) -> dict[str, object]:
    missing = [option for option in ("--onnx", "--saveEngine", *SHAPE_OPTIONS) if option not in values]
    if missing:
        raise Refused(f"missing {', '.join(missing)} (this double needs all of them)")
    if "--stronglyTyped" not in switches:
        raise Refused("--stronglyTyped is required (TensorRT 11 builds strongly typed networks only)")
    onnx_path = Path(values["--onnx"])
    inputs = graph_inputs(onnx_path)
    profile = {option: parse_shapes(option, values[option]) for option in SHAPE_OPTIONS}
    check_profile(inputs, profile)
    return {
        "fake": "tests/fakes/trtexec.py TEST DOUBLE, not a TensorRT engine",
        "tensorrt": dotted(version_code()),
        "onnx_sha256": hashlib.sha256(onnx_path.read_bytes()).hexdigest(),
        "shapes": {name: {"min": profile["--minShapes"][name], "opt": profile["--optShapes"][name],
                          "max": profile["--maxShapes"][name]} for name in inputs},
        "strongly_typed": True,
    }


def main(argv: list[str]) -> int:
    code = version_code()
    test_name = f"TensorRT.trtexec [TensorRT v{code}] [b0] # trtexec {' '.join(argv)}"
    print(f"&&&& RUNNING {test_name}", flush=True)
    if "--help" in argv or "-h" in argv:
        print("=== TEST DOUBLE trtexec (tests/fakes/trtexec.py) ===\n"
              f"  accepts: {' '.join(VALUE_OPTIONS)} {' '.join(SWITCHES)}", flush=True)
        return 0
    print(f"[I] TensorRT version: {dotted(code)}", flush=True)
    try:
        values, switches = parse(argv)
        engine = build(values, switches)
    except Refused as exc:
        for line in str(exc).splitlines():
            print(f"[E] {line}", flush=True)
        print(f"&&&& FAILED {test_name}", flush=True)
        return 1
    fault = os.environ.get("FAKE_TRTEXEC_FAIL", "")
    if fault == "hang":
        time.sleep(3600)
    print("[I] Engine built in 0.01 sec.", flush=True)
    if fault != "no-engine":
        Path(values["--saveEngine"]).write_text(json.dumps(engine, indent=2))
        print(f"[I] Saved engine to {values['--saveEngine']}", flush=True)
    print("[I] Skipped inference phase since --skipInference is added.", flush=True)
    print(f"&&&& PASSED {test_name}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
