"""Which files of a repo a build needs, and the policy checks on them (pickle weights, remote code).

Pure functions of file names (and config.json's content), so the same rules apply to a Hub listing before
download and to a local directory.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from enginesmith.core.errors import UserError

CONFIG_FILES = ["config.json", "generation_config.json"]
TOKENIZER_FILES = [
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja", "chat_template.json",
]
# A sentence-transformers encoder's pipeline: its modules, their order and the pooling each does (the ONNX road reads
# them; they decide the graph, so the checkpoint's digest covers them).
SENTENCE_TRANSFORMERS_FILES = ["modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"]
SENTENCE_TRANSFORMERS_MODULE_CONFIG = re.compile(r"^[0-9]+_[A-Za-z]+/config\.json$")
# What transformers loads, in its order: one weights file, else the index and the shards its weight_map names.
# Anything else at the root (Mistral's consolidated.safetensors, adapters, optimizer states) is not loaded.
SAFETENSORS_WEIGHTS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
PICKLE_WEIGHTS, PICKLE_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
WEIGHT_PATTERNS = ["*.safetensors", "*.bin", "*.pt", "*.pth"]


def needed_files(repo_files: Iterable[str], *, where: str, allow_pickle: bool,
                 read_json: Callable[[str], Any]) -> list[str]:
    """The files a build needs: configs, tokenizer, and the weights transformers would load (``model.safetensors``,
    else the shards ``model.safetensors.index.json`` names; pickle weights the same way, only if allowed).
    ``read_json`` reads a repo file by name (an index, when there is one to read).

    Raises a UserError naming ``where`` when there is no config.json, no weights transformers loads, an index that
    names a shard the repo lacks, or only pickle weights without ``allow_pickle``.
    """
    names = sorted(set(repo_files))
    if "config.json" not in names:
        raise UserError("no config.json: this is not a Transformers checkpoint", where=where)
    weights = _weight_set(names, SAFETENSORS_WEIGHTS, SAFETENSORS_INDEX, where=where, read_json=read_json)
    if weights is None:
        weights = _weight_set(names, PICKLE_WEIGHTS, PICKLE_INDEX, where=where, read_json=read_json)
        if weights is None:
            others = [n for n in names if "/" not in n and any(fnmatch.fnmatch(n, p) for p in WEIGHT_PATTERNS)]
            if not others:
                raise UserError("no weights found (no *.safetensors, no *.bin)", where=where)
            raise UserError(
                f"no weights transformers loads: {', '.join(others[:3])} but no {SAFETENSORS_WEIGHTS}, "
                f"{SAFETENSORS_INDEX}, {PICKLE_WEIGHTS} or {PICKLE_INDEX}", where=where,
                hint="consolidated.* files are Mistral's own format; use a revision with the Transformers files")
        if not allow_pickle:
            raise UserError(
                f"only pickle weights ({', '.join(weights[:3])}{', ...' if len(weights) > 3 else ''}): loading "
                "them can run arbitrary code",
                where=where,
                hint="prefer a safetensors revision of the model, or set 'allow_pickle: true' on the model in "
                     "the config (--allow-pickle on the command line) if you trust the repo",
            )
    return sorted({n for n in names if n in CONFIG_FILES or n in TOKENIZER_FILES or n in SENTENCE_TRANSFORMERS_FILES
                   or SENTENCE_TRANSFORMERS_MODULE_CONFIG.match(n)} | set(weights))


def _weight_set(names: list[str], single: str, index: str, *, where: str,
                read_json: Callable[[str], Any]) -> list[str] | None:
    if single in names:
        return [single]
    if index not in names:
        return None
    try:
        shards = sorted({str(shard) for shard in read_json(index)["weight_map"].values()})
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise UserError(f"{index} is not a weights index (no weight_map): {exc}", where=f"{where}/{index}") from None
    missing = [shard for shard in shards if shard not in names]
    if missing:
        raise UserError(f"{index} names shards the repo does not have: {', '.join(missing[:3])}",
                        where=f"{where}/{index}", hint="the checkpoint is incomplete; pull it again")
    return [index, *shards]


def remote_code_files(config: Mapping[str, Any], repo_files: Iterable[str]) -> list[str]:
    """The files that make a model need ``trust_remote_code``: modules named by config.json's ``auto_map``,
    and Python files at the repo root."""
    wanted: set[str] = set()
    for reference in (config.get("auto_map") or {}).values():
        for ref in reference if isinstance(reference, list) else [reference]:
            if isinstance(ref, str) and "." in ref:
                module = ref.split("--")[-1].rsplit(".", 1)[0]
                wanted.add(module.replace(".", "/") + ".py")
    wanted |= {n for n in repo_files if "/" not in n and n.endswith(".py")}
    return sorted(wanted)


def refuse_remote_code(config: Mapping[str, Any], repo_files: Iterable[str], *, where: str,
                       trust_remote_code: bool) -> None:
    files = remote_code_files(config, repo_files)
    if files and not trust_remote_code:
        named = "config.json's auto_map" if config.get("auto_map") else "the repo"
        raise UserError(
            f"the model needs trust_remote_code: {named} asks for {', '.join(files)}",
            where=where,
            hint="read that code, then set 'trust_remote_code: true' on the model in the config "
                 "(--trust-remote-code on the command line)",
        )
