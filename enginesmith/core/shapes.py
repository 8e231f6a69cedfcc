"""A model's layer widths as its ``config.json`` states them (and any quantisation its weights carry already), and
the AWQ block size a recipe can use on them. Pure: the planner reads ``config.json``, ``provenance.json`` and a few
rows of the weights (``checkpoints.weight_grid``) and decides here, before any calibration.

Block-quantised INT4 packs each weight row in blocks along its input dimension; ModelOpt's export refuses a
partial block ("Cannot pack weight with input dimension 576 and block size 128"), and TensorRT-LLM's
groupwise kernels need the input width to divide by the group size. So every quantised linear's input width
must divide by the block size: the recipe's preferred size when it does, else the first of its fallbacks
that does, else the cell is refused.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from enginesmith.core.checkpoints.weight_grid import WeightGrid
from enginesmith.core.specs import RecipeSpec


class PriorQuantization(BaseModel):
    """Weights that had been rounded to a coarse grid before this checkpoint was written: a GGUF dequantised to
    BF16 (its ``provenance.json`` says so, or its weights show the grid), or a checkpoint saved with a
    ``quantization_config``."""

    weight_bits: int = Field(gt=0)
    description: str  # "GGUF Q4_1, blocks of 32, dequantised to BF16"

    @classmethod
    def from_files(cls, config: dict[str, Any], provenance: dict[str, Any] | None,
                   weight_grid: WeightGrid | None = None) -> PriorQuantization | None:
        """What the files record, else what the weights show."""
        recorded = cls._recorded(config, provenance)
        if recorded is None and weight_grid is not None:
            return cls(weight_bits=weight_grid.weight_bits, description=weight_grid.describe())
        return recorded

    @classmethod
    def _recorded(cls, config: dict[str, Any], provenance: dict[str, Any] | None) -> PriorQuantization | None:
        source = (provenance or {}).get("source_quantization")
        if isinstance(source, dict) and source.get("weight_bits"):
            return cls(weight_bits=int(source["weight_bits"]),
                       description=f"{str(source.get('format', '')).upper()} {source.get('type', '')}, blocks of "
                                   f"{source.get('block_size')}, dequantised to BF16")
        quantization = config.get("quantization_config")
        if not isinstance(quantization, dict):
            return None
        method = str(quantization.get("quant_method", "quantised"))
        bits = 8 if method == "fp8" else quantization.get("bits") or quantization.get("w_bit")
        if not bits:
            return None
        return cls(weight_bits=int(bits), description=f"saved as {method} (config.json quantization_config)")


class ModelShape(BaseModel):
    model_type: str
    hidden_size: int = Field(gt=0)
    intermediate_size: int = Field(gt=0)
    num_attention_heads: int = Field(gt=0)
    num_key_value_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    vocab_size: int = Field(gt=0)
    tie_word_embeddings: bool = False
    prior_quantization: PriorQuantization | None = None
    # Mixtures of experts: each routed expert's MLP width (Qwen-MoE's and DeepSeek's moe_intermediate_size; Mixtral's
    # experts are intermediate_size wide) and the shared expert's, where the family has one.
    num_experts: int | None = None
    moe_intermediate_size: int | None = None
    shared_expert_intermediate_size: int | None = None
    max_position_embeddings: int | None = None

    @classmethod
    def from_config(cls, config: dict[str, Any], provenance: dict[str, Any] | None = None, *,
                    weight_grid: WeightGrid | None = None) -> ModelShape:
        """The shape of a decoder's ``config.json`` (Llama-style field names; head_dim derived when absent), and
        its weights' earlier quantisation where ``config.json`` or enginesmith's ``provenance.json`` records one,
        or ``weight_grid`` shows one."""
        heads = int(config["num_attention_heads"])
        return cls(
            model_type=str(config.get("model_type", "")),
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // heads),
            vocab_size=int(config["vocab_size"]),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            prior_quantization=PriorQuantization.from_files(config, provenance, weight_grid),
            num_experts=_first_int(config, "num_local_experts", "num_experts", "n_routed_experts"),
            moe_intermediate_size=_first_int(config, "moe_intermediate_size"),
            shared_expert_intermediate_size=_shared_expert_width(config),
            max_position_embeddings=_first_int(config, "max_position_embeddings"),
        )

    def quantized_input_widths(self, tp: int = 1) -> dict[str, int]:
        """The input width of each quantised linear on one tensor-parallel rank (lm_head and the embeddings stay
        unquantised): the row-parallel o_proj and down_proj are split along their input by ``tp``; so is each
        expert's down_proj (experts sharded by tensor parallelism, as vLLM and TensorRT-LLM do by default) and the
        shared expert's."""
        widths = {
            "q_proj/k_proj/v_proj": self.hidden_size,
            "o_proj": self.num_attention_heads * self.head_dim // tp,
            "gate_proj/up_proj": self.hidden_size,
            "down_proj": self.intermediate_size // tp,
        }
        if self.num_experts:
            widths["experts.down_proj"] = (self.moe_intermediate_size or self.intermediate_size) // tp
        if self.shared_expert_intermediate_size:
            widths["shared_expert.down_proj"] = self.shared_expert_intermediate_size // tp
        return widths


def _first_int(config: dict[str, Any], *names: str) -> int | None:
    return next((int(config[name]) for name in names if isinstance(config.get(name), int) and config[name] > 0), None)


def _shared_expert_width(config: dict[str, Any]) -> int | None:
    """Qwen2-MoE names its shared expert's width; DeepSeek has ``n_shared_experts`` experts of the routed width."""
    named = _first_int(config, "shared_expert_intermediate_size")
    if named:
        return named
    shared, width = _first_int(config, "n_shared_experts"), _first_int(config, "moe_intermediate_size")
    return shared * width if shared and width else None


class BlockSizeChoice(BaseModel):
    """The AWQ block size a cell quantises with, or why none fits (``size`` None)."""

    size: int | None
    preferred: int
    reason: str


def choose_awq_block_size(recipe: RecipeSpec, shape: ModelShape | None, *, tp: int = 1) -> BlockSizeChoice | None:
    """None for recipes without AWQ blocks. Without a known shape the preferred size is kept (the quantize
    stage checks the widths again before it loads the model)."""
    if recipe.awq_block_size is None:
        return None
    preferred = recipe.awq_block_size
    if shape is None:
        return BlockSizeChoice(size=preferred, preferred=preferred,
                               reason=f"block size {preferred} (model shape unknown at plan time)")
    widths = shape.quantized_input_widths(tp)
    for size in [preferred, *recipe.awq_block_size_fallbacks]:
        if all(width % size == 0 for width in widths.values()):
            if size == preferred:
                return BlockSizeChoice(size=size, preferred=preferred,
                                       reason=f"block size {size} divides every input width")
            misfits = _misfits(widths, preferred)
            return BlockSizeChoice(size=size, preferred=preferred,
                                   reason=f"block size {size}, not {preferred}: {misfits} "
                                          f"{'does' if ',' not in misfits else 'do'} not divide by {preferred}")
    tried = ", ".join(str(s) for s in [preferred, *recipe.awq_block_size_fallbacks])
    smallest = [preferred, *recipe.awq_block_size_fallbacks][-1]
    per_rank = f" per rank at tp={tp}" if tp > 1 else ""
    return BlockSizeChoice(size=None, preferred=preferred,
                           reason=f"no AWQ block size the runtimes accept ({tried}) divides every quantised input "
                                  f"width{per_rank}: {_misfits(widths, smallest)} not divisible by {smallest}")


def _misfits(widths: dict[str, int], size: int) -> str:
    return ", ".join(f"{name} {width}" for name, width in widths.items() if width % size)


def keyed_recipe(recipe: RecipeSpec, block_size: int | None) -> RecipeSpec:
    """The recipe as it enters the quantize key: with the AWQ block size actually used, when one was chosen."""
    return recipe.model_copy(update={"awq_block_size": block_size}) if block_size else recipe
