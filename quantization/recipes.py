"""Recipe → ModelOpt quantisation config (ModelOpt's own configs, copied before any change)."""

from __future__ import annotations

import copy
from typing import Any

from enginesmith.core.errors import UserError
from enginesmith.core.specs import RecipeSpec


def modelopt_config(recipe: RecipeSpec, *, awq_block_size: int | None = None) -> dict[str, Any]:
    """The ``mtq.quantize`` config of a recipe: its ModelOpt config, with an FP8 KV cache and the AWQ block
    size applied when the recipe asks for them."""
    import modelopt.torch.quantization as mtq

    if recipe.modelopt_config is None:
        raise ValueError(f"recipe {recipe.id} is a pass-through; it has no ModelOpt config")
    base = getattr(mtq, recipe.modelopt_config, None)
    if not isinstance(base, dict):
        raise UserError(f"ModelOpt has no config named {recipe.modelopt_config!r}", where=f"recipes.{recipe.id}",
                        hint="check modelopt_config in the catalogue's recipes.yaml against the installed "
                             "nvidia-modelopt")
    config = copy.deepcopy(base)
    block_size = awq_block_size or recipe.awq_block_size
    if block_size is not None:
        _set_weight_block_size(config, block_size)
    if recipe.kv_cache == "fp8":
        config = mtq.update_quant_cfg_with_kv_cache_quant(config, copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"]))
    return config


def _set_weight_block_size(config: dict[str, Any], block_size: int) -> None:
    entries = config["quant_cfg"]
    weight_entries = [e for e in entries if e.get("quantizer_name") == "*weight_quantizer"]
    for entry in weight_entries:
        cfgs = entry["cfg"] if isinstance(entry.get("cfg"), list) else [entry.get("cfg")]
        for cfg in cfgs:
            if cfg and cfg.get("block_sizes") is not None and cfg.get("num_bits") == 4:
                cfg["block_sizes"][-1] = block_size
