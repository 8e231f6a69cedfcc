"""Print the memory model's numbers for the matrix's large models on H100, H200 and L40S as a Markdown table
(the one in docs/how-to/runtime-environments.md; ``tests/test_readme.py`` checks the two agree).

    python scripts/memory_table.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from enginesmith.core.config import default_catalogue
from enginesmith.core.memory import GIB, SERVED_REFERENCE_BYTES, cell_needs, quantize_need, serving_need

MODELS = {"Llama-3.1-8B": 8.03e9, "Llama-3.1-70B": 70.6e9}  # params_b in configs/nightly.yaml
TARGETS = ("h100-sxm", "h200", "l40s")
RECIPE = "fp8"
CHECKPOINT_BYTES = 2  # both ship in BF16
PARALLEL_SIZES = (1, 2, 4, 8)


def fewest(need_on: dict[int, float], memory_bytes: float) -> str:
    """The fewest GPUs (of PARALLEL_SIZES) on which the per-GPU need fits, with that need."""
    for count in PARALLEL_SIZES:
        if need_on[count] <= memory_bytes:
            return f"{count} × {need_on[count] / GIB:.1f}"
    return "does not fit 8"


def rows() -> list[list[str]]:
    catalogue = default_catalogue()
    recipe = catalogue.recipes[RECIPE]
    table = []
    for model, parameters in MODELS.items():
        for target_id in TARGETS:
            target = catalogue.targets[target_id]
            memory = target.memory_gib * GIB
            quantise = {n: quantize_need(int(parameters), on_gpu=True, checkpoint_dtype_bytes=CHECKPOINT_BYTES,
                                         devices=n).per_device_bytes for n in PARALLEL_SIZES}
            candidate = {n: serving_need("candidate", parameters * recipe.weight_bytes_per_param, n).per_device_bytes
                         for n in PARALLEL_SIZES}
            reference = {n: serving_need("reference", parameters * SERVED_REFERENCE_BYTES, n).per_device_bytes
                         for n in PARALLEL_SIZES}
            allowed = [f"tp{tp}" for tp in PARALLEL_SIZES
                       if all(need.fits for need in cell_needs(parameters, CHECKPOINT_BYTES, recipe, target, tp=tp,
                                                                pp=1))]
            table.append([model, f"{target_id} ({target.memory_gib:g} GiB)", fewest(quantise, memory),
                          fewest(candidate, memory), fewest(reference, memory), ", ".join(allowed) or "none"])
    return table


def markdown() -> str:
    header = ["model", "GPU", "quantise (GPUs × GiB each)", f"{RECIPE} candidate", "BF16 reference",
              f"{RECIPE} cells the plan allows"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
