"""What the load generator sends: random-token prompts of exact lengths, a local ShareGPT file, or a
shipped task's prompts. Prompts are text (strict servers take no token-id prompts), built with the model's
own tokenizer (``tokenizer.json``, read with the ``tokenizers`` library)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from enginesmith.core.assets import read_task
from enginesmith.core.errors import UserError
from enginesmith.core.specs import WorkloadSpec

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@dataclass(frozen=True)
class Prompt:
    text: str
    prompt_len: int
    output_len: int
    answer: str | None = None  # the expected answer, for task prompts


def load_tokenizer(model_dir: Path) -> Tokenizer:
    from tokenizers import Tokenizer

    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise UserError("no tokenizer.json: cannot build prompts of exact token lengths", where=str(model_dir))
    return Tokenizer.from_file(str(path))


def context_length(model_dir: Path) -> int | None:
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        return None
    return json.loads(config_path.read_text()).get("max_position_embeddings")


def build_prompts(workload: WorkloadSpec, model_dir: Path, *, seed: int = 0) -> list[Prompt]:
    """The workload's prompts; refuses one longer than the model's context before anything starts."""
    tokenizer = load_tokenizer(model_dir)
    if workload.dataset == "random":
        prompts = _random_prompts(tokenizer, workload, seed)
    elif workload.dataset == "sharegpt":
        prompts = _sharegpt_prompts(tokenizer, workload)
    else:
        prompts = _task_prompts(tokenizer, workload)
    limit = context_length(model_dir)
    longest = max(p.prompt_len + p.output_len for p in prompts)
    if limit is not None and longest > limit:
        raise UserError(
            f"the workload needs {longest} tokens (prompt + output) but the model's context is {limit}",
            where=f"workload {workload.name}", hint="lower input_len/output_len")
    return prompts


PERPLEXITY_WINDOW_TOKENS = 512


def perplexity_windows(paragraphs: list[str], model_dir: Path) -> list[str]:
    """The held-out paragraphs cut into texts of at most ``PERPLEXITY_WINDOW_TOKENS`` tokens (fewer for a model
    with a shorter context), so every request fits the model: a paragraph longer than that is split."""
    tokenizer = load_tokenizer(model_dir)
    limit = min(PERPLEXITY_WINDOW_TOKENS, (context_length(model_dir) or PERPLEXITY_WINDOW_TOKENS) - 2)
    windows: list[str] = []
    for paragraph in paragraphs:
        ids = tokenizer.encode(paragraph, add_special_tokens=False).ids
        windows.extend(tokenizer.decode(ids[start:start + limit]) for start in range(0, len(ids), limit))
    return windows


def _stable_token_ids(tokenizer: Tokenizer) -> list[int]:
    """Token ids that survive decode → encode next to themselves: a run of them keeps its length."""
    special = {tokenizer.token_to_id(t) for t in ("<s>", "</s>", "<unk>", "<pad>")}
    stable = []
    for token_id in range(tokenizer.get_vocab_size()):
        if token_id in special:
            continue
        pair = [token_id, token_id]
        if tokenizer.encode(tokenizer.decode(pair), add_special_tokens=False).ids == pair:
            stable.append(token_id)
    return stable


def _random_prompts(tokenizer: Tokenizer, workload: WorkloadSpec, seed: int) -> list[Prompt]:
    """Like vLLM's random dataset, a run of token ids from a random offset, but grown one token at a time and
    kept only while the decoded text re-encodes to exactly those tokens: each prompt is ``input_len`` tokens."""
    rng = random.Random(seed)
    vocab = _stable_token_ids(tokenizer)
    prompts = []
    for index in range(workload.num_prompts):
        offset = rng.randrange(len(vocab))
        ids: list[int] = []
        for position in range(workload.input_len * 4):
            if len(ids) == workload.input_len:
                break
            trial = [*ids, vocab[(offset + index + position) % len(vocab)]]
            if len(tokenizer.encode(tokenizer.decode(trial), add_special_tokens=False).ids) == len(trial):
                ids = trial
        text = tokenizer.decode(ids)
        prompt_len = len(tokenizer.encode(text, add_special_tokens=False).ids)
        prompts.append(Prompt(text=text, prompt_len=prompt_len, output_len=workload.output_len))
    return prompts


def _sharegpt_prompts(tokenizer: Tokenizer, workload: WorkloadSpec) -> list[Prompt]:
    if not workload.dataset_path:
        raise UserError("a sharegpt workload needs dataset_path", where=f"workload {workload.name}")
    path = Path(workload.dataset_path)
    try:
        conversations = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError("ShareGPT file not found", where=str(path)) from None
    prompts = []
    for entry in conversations:
        turns = entry.get("conversations", [])
        if len(turns) < 2:
            continue
        prompt_len = len(tokenizer.encode(turns[0]["value"], add_special_tokens=False).ids)
        output_len = len(tokenizer.encode(turns[1]["value"], add_special_tokens=False).ids)
        # vLLM's filter: drop tiny or over-long pairs.
        if prompt_len < 4 or output_len < 4 or prompt_len > 1024 or prompt_len + output_len > 2048:
            continue
        prompts.append(Prompt(text=turns[0]["value"], prompt_len=prompt_len, output_len=output_len))
        if len(prompts) == workload.num_prompts:
            break
    if not prompts:
        raise UserError("no usable conversations in the ShareGPT file", where=str(path))
    return prompts


def _task_prompts(tokenizer: Tokenizer, workload: WorkloadSpec) -> list[Prompt]:
    task = workload.accuracy_tasks[0] if workload.accuracy_tasks else "addition"
    rows = read_task(task)
    prompts = []
    for index in range(workload.num_prompts):
        row = rows[index % len(rows)]
        prompt_len = len(tokenizer.encode(row.prompt, add_special_tokens=False).ids)
        prompts.append(Prompt(text=row.prompt, prompt_len=prompt_len, output_len=workload.output_len,
                              answer=row.answer))
    return prompts
