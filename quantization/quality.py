"""The quality report's numbers: logits against the reference on held-out tokens, and a task's exact match on an
in-memory model (a fake-quantised one cannot be saved and reloaded with transformers)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from enginesmith.core.assets import TaskExample, read_task_file

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase


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


def evaluate_exact_match(
    model_dir: Path | str,
    eval_jsonl: Path | str,
    dtype: str = "bfloat16",
    limit: int | None = None,
    batch_size: int = 128,
    max_new_tokens: int = 8,
) -> float:
    """Return the share (0..1) of eval prompts whose greedy completion equals the answer.

    Loads the checkpoint in ``model_dir`` with transformers in ``dtype`` and scores it with
    :func:`exact_match`. ``limit`` keeps only the first that many examples.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    examples = read_task_file(Path(eval_jsonl))[:limit]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
    return exact_match(model, tokenizer, examples, batch_size=batch_size, max_new_tokens=max_new_tokens)


def exact_match(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[TaskExample],
    batch_size: int = 128,
    max_new_tokens: int = 8,
) -> float:
    """Return the share (0..1) of ``examples`` whose greedy completion equals the answer.

    Works on an in-memory model, e.g. a fake-quantised one that cannot be saved and reloaded with
    transformers. Prompts are decoded greedily in batches with left padding; each completion
    stops at ``</s>`` or at the first newline and is compared, stripped, to the expected answer.
    """
    import torch

    original_padding_side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    model.eval()
    matches = 0
    try:
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            inputs = tokenizer(
                [e.prompt for e in chunk],
                return_tensors="pt",
                padding=True,
                return_token_type_ids=False,
            ).to(model.device)
            with torch.no_grad():
                # PreTrainedModel does not declare generate(); its GenerationMixin subclasses do.
                output_ids = model.generate(  # type: ignore[operator]
                    **inputs,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id,
                )
            completions = tokenizer.batch_decode(
                output_ids[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True
            )
            matches += sum(
                completion.split("\n", 1)[0].strip() == example.answer
                for completion, example in zip(completions, chunk, strict=True)
            )
    finally:
        tokenizer.padding_side = original_padding_side
    return matches / len(examples)
