"""Which files of a repo a build needs, and the policy checks on them (pickle weights, remote code).

Pure functions of file names (and config.json's content), so the same rules apply to a Hub listing before
download and to a local directory.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

from enginesmith.errors import UserError

CONFIG_FILES = ["config.json", "generation_config.json"]
TOKENIZER_FILES = [
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json",
]
SAFETENSORS_PATTERNS = ["*.safetensors", "model.safetensors.index.json"]
PICKLE_PATTERNS = ["*.bin", "*.pt", "*.pth", "pytorch_model.bin.index.json"]


def _matches(name: str, patterns: Iterable[str]) -> bool:
    # Weights and configs live at the repo root; subfolders (original/, onnx/, ...) are other formats.
    return "/" not in name and any(fnmatch.fnmatch(name, p) for p in patterns)


def needed_files(repo_files: Iterable[str], *, where: str, allow_pickle: bool) -> list[str]:
    """The files a build needs: configs, tokenizer, safetensors weights (pickle weights only if allowed).

    Raises a UserError naming ``where`` when there is no config.json, no weights, or only pickle weights
    without ``allow_pickle``.
    """
    names = sorted(set(repo_files))
    if "config.json" not in names:
        raise UserError("no config.json: this is not a Transformers checkpoint", where=where)
    weights = [n for n in names if _matches(n, SAFETENSORS_PATTERNS)]
    if not any(n.endswith(".safetensors") for n in weights):
        pickles = [n for n in names if _matches(n, PICKLE_PATTERNS)]
        if not pickles:
            raise UserError("no weights found (no *.safetensors, no *.bin)", where=where)
        if not allow_pickle:
            raise UserError(
                f"only pickle weights ({', '.join(pickles[:3])}{', ...' if len(pickles) > 3 else ''}): loading "
                "them can run arbitrary code",
                where=where,
                hint="prefer a safetensors revision of the model, or set 'allow_pickle: true' on the model in "
                     "the config (--allow-pickle on the command line) if you trust the repo",
            )
        weights = pickles
    return sorted({n for n in names if n in CONFIG_FILES or n in TOKENIZER_FILES} | set(weights))


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
