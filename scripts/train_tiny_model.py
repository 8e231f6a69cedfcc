"""Train the shared tiny addition Llama and write its committed assets.

Writes the model to enginesmith/assets/tiny-llama/, the held-out eval set to
enginesmith/assets/tasks/addition-eval.jsonl and the calibration text to
enginesmith/assets/calibration/addition-calib.txt, then prints the BF16 greedy exact match on
the eval set. Needs the project installed in the venv (scripts/setup.sh):
``.venv/bin/python scripts/train_tiny_model.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from quantization import tiny_models


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the parsed command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=tiny_models.DEFAULT_TRAIN_STEPS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--model-dir", type=Path, default=tiny_models.TINY_MODEL_DIR)
    parser.add_argument("--eval-jsonl", type=Path, default=tiny_models.ADDITION_EVAL_JSONL)
    parser.add_argument("--calibration-txt", type=Path, default=tiny_models.ADDITION_CALIBRATION_TXT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train, write the assets, print the BF16 exact match; return the exit status."""
    import torch

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    summary = tiny_models.train_tiny_model(args.model_dir, steps=args.steps, seed=args.seed)
    tiny_models.write_eval_jsonl(args.eval_jsonl)
    tiny_models.write_calibration_text(args.calibration_txt)
    exact_match = tiny_models.evaluate_exact_match(args.model_dir, args.eval_jsonl)
    model_bytes = (args.model_dir / "model.safetensors").stat().st_size
    print(
        f"trained {summary.steps} steps in {summary.wall_seconds:.0f} s "
        f"(final loss {summary.final_loss:.4f}); model.safetensors {model_bytes} bytes"
    )
    print(f"BF16 greedy exact match on {args.eval_jsonl.name}: {exact_match:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
