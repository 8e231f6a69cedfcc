"""Tokenise a fixed text with each model directory's tokenizer as vLLM loads it (``vllm.tokenizers.get_tokenizer``,
else transformers' ``AutoTokenizer`` where that vLLM has none), inside the runtime's own environment.

Runs inside a vLLM environment (``.venv-vllm-cpu``), which does not have enginesmith installed: it imports only the
runtime's packages and the standard library. Reads ``{"models": [dir, ...], "text": str}`` on stdin and writes
``{"transformers": version, "ids": {dir: [token ids]}, "errors": {dir: reason}}``.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def load(model: str) -> Any:
    try:
        from vllm.tokenizers import get_tokenizer
    except ImportError:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(model)
    return get_tokenizer(model)


def main() -> None:
    request = json.load(sys.stdin)
    import transformers

    ids: dict[str, list[int]] = {}
    errors: dict[str, str] = {}
    for model in request["models"]:
        try:
            ids[model] = list(load(model).encode(request["text"], add_special_tokens=False))
        except Exception as exc:  # reported per model: one unreadable tokenizer says nothing of the others
            errors[model] = f"{type(exc).__name__}: {exc}"
    json.dump({"transformers": transformers.__version__, "ids": ids, "errors": errors}, sys.stdout)


if __name__ == "__main__":
    main()
