"""How much does `enginesmith quantize` add over the bare ModelOpt calls it makes?

Both sides run as fresh processes on the same model, recipe and calibration tokens, alternating, in one run:
- bare: load in fp32, mtq.quantize with the same config and forward loop, cast to BF16,
  export_hf_checkpoint and export_tensorrt_llm_checkpoint;
- enginesmith: `enginesmith quantize` (the same, plus the quality report, the export checks, the dequantised
  export check, file hashes, the metadata and the completion marker).

Prints the median wall time of each and the overhead ratio (target: ≤ 1.10).
Usage: python bench/quantize_overhead.py [--model DIR] [--recipe int4-awq] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

BARE = """
import copy, sys, torch
torch.set_num_threads(1)
import modelopt.torch.quantization as mtq
from modelopt.torch.export import export_hf_checkpoint, export_tensorrt_llm_checkpoint
from transformers import AutoModelForCausalLM, AutoTokenizer
from enginesmith.core.config import default_catalogue
from quantization.calibration import load_calibration
from quantization.recipes import modelopt_config
model_dir, recipe_id, out, samples, seq_len, batch = sys.argv[1:7]
tokenizer = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
data = load_calibration("builtin:addition", tokenizer, samples=int(samples), seq_len=int(seq_len),
                        batch_size=int(batch))
def loop(m):
    with torch.no_grad():
        for b in data.batches:
            m(input_ids=b)
model = mtq.quantize(model, modelopt_config(default_catalogue().recipes[recipe_id]), loop)
model = model.to(torch.bfloat16)
with torch.inference_mode():
    export_hf_checkpoint(model, dtype=torch.bfloat16, export_dir=out + "/hf")
    export_tensorrt_llm_checkpoint(model, "llama", dtype=torch.bfloat16, export_dir=out + "/trtllm",
                                   inference_tensor_parallel=1)
"""


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "ENGINESMITH_CPU_THREADS": "1"})
    return time.perf_counter() - start


def main() -> None:
    from enginesmith.core.assets import tiny_model_dir

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=tiny_model_dir())
    parser.add_argument("--recipe", default="int4-awq")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    sizes = [str(args.samples), str(args.seq_len), str(args.batch_size)]
    bare_times, ours_times = [], []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as scratch:
            bare_out, ours_out = Path(scratch, "bare"), Path(scratch, "ours")
            bare = [sys.executable, "-c", BARE, str(args.model), args.recipe, str(bare_out), *sizes]
            ours = [sys.executable, "-m", "enginesmith", "quantize", str(args.model), "--recipe", args.recipe,
                    "--out", str(ours_out), "--device", "cpu", "--samples", sizes[0], "--seq-len", sizes[1],
                    "--batch-size", sizes[2]]
            order = [(bare, bare_times), (ours, ours_times)]
            for command, times in order if repeat % 2 == 0 else reversed(order):
                times.append(timed(command))
            shutil.rmtree(scratch, ignore_errors=True)
    bare_median, ours_median = statistics.median(bare_times), statistics.median(ours_times)
    print(f"model {args.model.name}, recipe {args.recipe}, {args.samples}×{args.seq_len} calibration tokens, "
          f"{args.repeats} alternating runs each")
    print(f"bare ModelOpt script : median {bare_median:6.2f} s  {[round(t, 2) for t in bare_times]}")
    print(f"enginesmith quantize : median {ours_median:6.2f} s  {[round(t, 2) for t in ours_times]}")
    print(f"overhead ratio       : {ours_median / bare_median:.3f}  (target ≤ 1.10)")


if __name__ == "__main__":
    main()
