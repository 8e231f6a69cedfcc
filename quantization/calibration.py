"""Calibration data: text from a shipped file, a local file or a Hub dataset, tokenized and packed into
``samples`` blocks of ``seq_len`` tokens (plus held-out blocks for the quality report)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from enginesmith.core.artefacts import CalibrationRecord
from enginesmith.core.calibration import calibration_source_path
from enginesmith.core.errors import UserError

if TYPE_CHECKING:
    import torch

# Hub datasets: which split and text field to read (the field's usual defaults).
HUB_TEXT_FIELDS: dict[str, tuple[str, str, str | None]] = {
    "cnn_dailymail": ("train", "article", "3.0.0"),
    "abisee/cnn_dailymail": ("train", "article", "3.0.0"),
    "wikitext": ("train", "text", "wikitext-2-raw-v1"),
}


@dataclass
class CalibrationData:
    batches: list[torch.Tensor]  # [batch_size, seq_len] token ids
    held_out: torch.Tensor  # [n, seq_len] token ids, never seen by calibration
    record: CalibrationRecord


def read_texts(dataset: str, limit_chars: int) -> tuple[list[str], str]:
    """The calibration texts and the sha256 of their source bytes. JSONL lines contribute ``text``, or
    ``prompt`` + ``answer``."""
    path = calibration_source_path(dataset)
    if path is None:
        return _hub_texts(dataset, limit_chars)
    raw = path.read_bytes()
    if path.suffix == ".jsonl":
        texts = []
        for number, line in enumerate(raw.decode().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"line is not JSON: {exc.msg}", where=f"{path}:{number}") from None
            texts.append(row.get("text") or f"{row.get('prompt', '')}{row.get('answer', '')}")
    else:
        texts = [line for line in raw.decode().splitlines() if line.strip()]
    return texts, hashlib.sha256(raw).hexdigest()


def _hub_texts(dataset: str, limit_chars: int) -> tuple[list[str], str]:
    try:
        import datasets
    except ImportError:
        raise UserError(f"calibration dataset {dataset!r} comes from the Hub, which needs the 'datasets' package",
                        where="calibration.dataset",
                        hint="pip install datasets, or use a local file / builtin:addition") from None
    split, field, subset = HUB_TEXT_FIELDS.get(dataset, ("train", "text", None))
    rows = datasets.load_dataset(dataset, subset, split=split, streaming=True)
    texts: list[str] = []
    total = 0
    for row in rows:
        texts.append(row[field])
        total += len(row[field])
        if total >= limit_chars:
            break
    digest = hashlib.sha256("\n".join(texts).encode()).hexdigest()
    return texts, digest


def load_calibration(dataset: str, tokenizer: Any, *, samples: int, seq_len: int, batch_size: int,
                     held_out: int = 8) -> CalibrationData:
    """Tokenize the texts as one stream and cut it into ``samples + held_out`` blocks of ``seq_len`` tokens.

    Raises a UserError when the set is missing, empty or too short for the requested samples.
    """
    import torch

    texts, content_sha256 = read_texts(dataset, limit_chars=(samples + held_out) * seq_len * 8)
    if not texts:
        raise UserError(f"calibration set {dataset!r} is empty", where="calibration.dataset")
    separator = tokenizer.eos_token_id
    stream: list[int] = []
    for text in texts:
        stream.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
        if separator is not None:
            stream.append(separator)
    needed = (samples + held_out) * seq_len
    if len(stream) < needed:
        available = len(stream) // seq_len - held_out
        raise UserError(
            f"calibration set {dataset!r} has {len(stream)} tokens: {max(available, 0)} samples of {seq_len} tokens "
            f"(+{held_out} held out), fewer than the {samples} requested",
            where="calibration.dataset",
            hint="lower calibration.samples or calibration.seq_len, or use a larger set",
        )
    blocks = torch.tensor(stream[:needed], dtype=torch.long).view(samples + held_out, seq_len)
    calibration_blocks, held_out_blocks = blocks[:samples], blocks[samples:]
    return CalibrationData(
        batches=list(calibration_blocks.split(batch_size)),
        held_out=held_out_blocks,
        record=CalibrationRecord(dataset=dataset, content_sha256=content_sha256, samples=samples, seq_len=seq_len,
                                 batch_size=batch_size, tokens=samples * seq_len),
    )
