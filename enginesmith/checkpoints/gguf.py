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
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / "README.md").write_text(card)
        (staging / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
        if not (staging / SAFETENSORS_NAME).is_file():
            raise UserError(f"the conversion wrote no {SAFETENSORS_NAME}", where=str(staging))
        staging.chmod(0o755)  # mkdtemp made it private; the checkpoint is for anyone on the node to read
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir
