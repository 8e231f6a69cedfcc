"""The quality report's numbers: logits against the reference on held-out tokens."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def held_out_logits(model: torch.nn.Module, held_out: torch.Tensor, batch_size: int = 8) -> torch.Tensor:
    """fp32 logits [n, seq_len, vocab] of ``model`` on the held-out blocks."""
    import torch

    device = next(model.parameters()).device
    outputs = []
    with torch.no_grad():
        for block in held_out.split(batch_size):
            outputs.append(model(input_ids=block.to(device)).logits.float().cpu())
    return torch.cat(outputs)


def logits_rel_err(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    """‖candidate − reference‖ / ‖reference‖ (Frobenius, over every position and vocab entry)."""
    return float((candidate - reference).norm() / reference.norm())


def top1_agreement(candidate: torch.Tensor, reference: torch.Tensor) -> float:
    """Share of positions where the argmax token agrees."""
    return float((candidate.argmax(-1) == reference.argmax(-1)).float().mean())


@contextmanager
def weight_quantizers_only(model: torch.nn.Module) -> Iterator[None]:
    """Switch off the activation and KV-cache quantizers that are on, and back on afterwards (AWQ's
    ``pre_quant_scale`` still applies: ModelOpt applies it before the enabled check)."""
    from modelopt.torch.quantization.nn import TensorQuantizer

    switched = [
        module for name, module in model.named_modules()
        if isinstance(module, TensorQuantizer) and module.is_enabled
        and name.endswith(("input_quantizer", "bmm_quantizer"))
    ]
    for module in switched:
        module.disable()
    try:
        yield
    finally:
        for module in switched:
            module.enable()
