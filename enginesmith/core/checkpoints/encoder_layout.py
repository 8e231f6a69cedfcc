"""What a sentence-transformers directory says its modules are (``modules.json``, the pooling config,
``sentence_bert_config.json``): read when an encoder is planned (its pooling is part of its export key and its plan
rules) and when it is exported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from enginesmith.core.errors import UserError

PoolingMode = Literal["mean", "cls", "max", "mean_sqrt_len"]


class EncoderLayout(BaseModel):
    """What a sentence-transformers directory says its modules are."""

    model_config = ConfigDict(frozen=True)

    pooling: PoolingMode
    normalize: bool
    hidden_size: int
    max_seq_length: int | None


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise UserError(f"cannot read it: {exc.strerror}", where=str(path)) from None
    except json.JSONDecodeError as exc:
        raise UserError(f"not valid JSON (line {exc.lineno}): {exc.msg}", where=str(path)) from None


def read_layout(model_dir: Path) -> EncoderLayout:
    """The pooling and normalisation ``modules.json`` names, in the order sentence-transformers applies them.

    Raises a UserError naming the file for a directory that is not a Transformer → Pooling [→ Normalize] pipeline.
    """
    modules_path = model_dir / "modules.json"
    modules = _read_json(modules_path)
    if not isinstance(modules, list):
        raise UserError("expected a list of modules", where=str(modules_path))
    kinds = [str(module.get("type", "")).rsplit(".", 1)[-1] for module in modules if isinstance(module, dict)]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise UserError(f"modules {kinds} are not Transformer, Pooling[, Normalize]", where=str(modules_path),
                        hint="only plain sentence-transformers encoders export here (no Dense or other heads)")
    pooling_module = next(m for m in modules if str(m.get("type", "")).endswith(".Pooling"))
    pooling_path = model_dir / pooling_module.get("path", "1_Pooling") / "config.json"
    pooling_config = _read_json(pooling_path)
    if not isinstance(pooling_config, dict):
        raise UserError("expected an object", where=str(pooling_path))
    modes = {"mean": "pooling_mode_mean_tokens", "cls": "pooling_mode_cls_token", "max": "pooling_mode_max_tokens",
             "mean_sqrt_len": "pooling_mode_mean_sqrt_len_tokens"}
    chosen = [mode for mode, key in modes.items() if pooling_config.get(key)]
    unknown = [k for k, v in pooling_config.items() if k.startswith("pooling_mode_") and v and k not in modes.values()]
    if len(chosen) != 1 or unknown:
        raise UserError(f"pooling modes {chosen + unknown} enabled; exactly one of {sorted(modes)} is supported",
                        where=str(pooling_path))
    max_seq_length = None
    bert_config = model_dir / "sentence_bert_config.json"
    if bert_config.is_file():
        value = _read_json(bert_config)
        max_seq_length = value.get("max_seq_length") if isinstance(value, dict) else None
    return EncoderLayout(pooling=chosen[0], normalize=kinds[-1] == "Normalize",
                         hidden_size=int(pooling_config["word_embedding_dimension"]), max_seq_length=max_seq_length)
