"""TEST DOUBLE for ``trtllm-build`` (TensorRT-LLM 1.2.x), at the process boundary we cannot cross here: the
real tool needs an NVIDIA GPU and TensorRT-LLM wheels, neither of which exist on this machine.

It accepts exactly the documented flags (argparse refuses any other, as the real tool does), checks the
input checkpoint's layout, and writes the documented engine layout: ``config.json`` with ``version``,
``pretrained_config`` and ``build_config``, and one ``rank{r}.engine`` per rank of the checkpoint's mapping.
It fails on demand through ``FAKE_TRTLLM_BUILD_FAIL``: ``exit`` (status 1), ``oom`` (an out-of-memory log
line, status 1), ``sm100`` (the builder's SM guard), ``missing-rank`` (exits 0 without the last rank file),
``hang`` (never finishes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from importlib.metadata import version
from pathlib import Path

TOGGLE = ["enable", "disable"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="trtllm-build")
    parser.add_argument("--checkpoint_dir", required=True)
    parser.add_argument("--output_dir", default="engine_outputs")
    for flag in ("--max_batch_size", "--max_input_len", "--max_seq_len", "--max_num_tokens", "--workers",
                 "--max_beam_width", "--opt_num_tokens", "--tokens_per_block"):
        parser.add_argument(flag, type=int)
    parser.add_argument("--kv_cache_type", choices=["continuous", "paged", "disabled"])
    parser.add_argument("--gemm_plugin",
                        choices=["auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"])
    for flag in ("--use_paged_context_fmha", "--use_fp8_context_fmha", "--multiple_profiles", "--context_fmha",
                 "--remove_input_padding", "--use_fused_mlp", "--reduce_fusion"):
        parser.add_argument(flag, choices=TOGGLE)
    parser.add_argument("--gather_context_logits", action="store_true")
    parser.add_argument("--log_level", default="info")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    args = parse(argv)
    checkpoint = Path(args.checkpoint_dir)
    config = json.loads((checkpoint / "config.json").read_text())
    world_size = config.get("mapping", {}).get("world_size", 1)
    for rank in range(world_size):
        if not (checkpoint / f"rank{rank}.safetensors").is_file():
            print(f"[TensorRT-LLM][ERROR] rank{rank}.safetensors not found in {checkpoint}", flush=True)
            return 1
    print(f"[TensorRT-LLM] TensorRT-LLM version: {version('tensorrt_llm')}", flush=True)
    print(f"[TensorRT-LLM][INFO] Building {config.get('architecture')} with {world_size} rank(s)", flush=True)
    fault = os.environ.get("FAKE_TRTLLM_BUILD_FAIL", "")
    if fault == "hang":
        time.sleep(3600)
    if fault == "oom":
        print("[TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::154] Error Code 2: OutOfMemory "
              "(Requested size was 17179869184 bytes.)", flush=True)
        return 1
    if fault == "sm100":
        print("RuntimeError: INT8/INT4 quantization is not supported on SM>=100.", flush=True)
        return 1
    if fault == "exit":
        print("[TensorRT-LLM][ERROR] something went wrong", flush=True)
        return 1
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    build_config = {k: v for k, v in vars(args).items() if k not in {"checkpoint_dir", "output_dir", "log_level"}}
    engine_config = {"version": version("tensorrt_llm"), "pretrained_config": config, "build_config": build_config}
    (output / "config.json").write_text(json.dumps(engine_config, indent=2))
    ranks = range(world_size - 1) if fault == "missing-rank" else range(world_size)
    for rank in ranks:
        (output / f"rank{rank}.engine").write_bytes(os.urandom(4096))
        print(f"[TensorRT-LLM][INFO] Engine for rank {rank} saved", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
