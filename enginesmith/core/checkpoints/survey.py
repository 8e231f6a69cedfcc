"""What a checkpoint is, without downloading its weights: the commit a revision resolves to, the weight files a
runtime would load, the parameter count, and ``config.json``. What ``enginesmith preflight`` reads.

Offline (``HF_HUB_OFFLINE=1``) only the Hub cache is read, and only ``config.json`` and the safetensors index need
to be there: the shards the index names are taken as the repo's (they cannot be listed), and the parameter count
comes from the index's ``total_size``. Online the repo is listed and the safetensors headers are read from the Hub
(range requests, no weights downloaded).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from enginesmith.core.checkpoints.files import SAFETENSORS_INDEX, needed_files, refuse_remote_code
from enginesmith.core.checkpoints.inspect import model_shape, read_config
from enginesmith.core.checkpoints.pull import cached_snapshot, hub_error, local_checkpoint
from enginesmith.core.checkpoints.tokenizer_files import (
    TokenizerFiles,
    eos_disagreement,
    unregistered_control_tokens,
)
from enginesmith.core.errors import UserError
from enginesmith.core.memory import dtype_bytes
from enginesmith.core.secrets import hf_token
from enginesmith.core.shapes import ModelShape
from enginesmith.core.specs import ModelSpec, check_revision

CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
TOKENIZER_CONFIG, TOKENIZER_JSON = "tokenizer_config.json", "tokenizer.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"


class TokenizerFacts(BaseModel):
    """What a server needs of the tokenizer files: a chat template for /v1/chat/completions, and an end-of-sequence
    token to stop generating at, the one the generation config stops at; and the control tokens it would not read
    as such. None where it could not be read from here."""

    chat_template: bool | None = None
    eos_token: bool | None = None
    eos_disagreement: str | None = None  # why the tokenizer's EOS is not generation_config's (None: they agree)
    unregistered_control_tokens: list[tuple[str, int]] = []

    @classmethod
    def read(cls, names: Iterable[str], read_json: Callable[[str], Any]) -> TokenizerFacts:
        names = set(names)

        def optional(name: str) -> dict[str, Any] | None:
            if name not in names:
                return None
            try:
                found = read_json(name)
            except (UserError, OSError):
                return None
            return found if isinstance(found, dict) else None

        tokenizer_config = optional(TOKENIZER_CONFIG)
        if any(name in names for name in CHAT_TEMPLATE_FILES) or (tokenizer_config or {}).get("chat_template"):
            chat_template: bool | None = True
        else:
            chat_template = False if TOKENIZER_CONFIG not in names or tokenizer_config is not None else None
        model_config = optional("config.json") or {}
        generation = optional("generation_config.json") or {}
        eos = (model_config.get("eos_token_id") is not None or generation.get("eos_token_id") is not None
               or bool((tokenizer_config or {}).get("eos_token")))
        files = TokenizerFiles(tokenizer=optional(TOKENIZER_JSON) or {}, tokenizer_config=tokenizer_config or {},
                               special_tokens_map=optional(SPECIAL_TOKENS_MAP) or {}, generation_config=generation,
                               config=model_config)
        return cls(chat_template=chat_template, eos_token=eos or (None if tokenizer_config is None else False),
                   eos_disagreement=eos_disagreement(files),
                   unregistered_control_tokens=unregistered_control_tokens(files))


class CheckpointSurvey(BaseModel):
    commit_sha: str
    weight_files: list[str]
    parameters: int | None
    parameters_from: str  # where the count was read: "safetensors headers", "index total_size", …
    dtype_bytes: int
    shape: ModelShape | None
    tokenizer: TokenizerFacts = TokenizerFacts()
    notes: list[str] = []  # checks that could not be made from here
    # Where its files were read on this machine: the local directory, or the Hub cache's snapshot (the files read
    # online land there too); a tokenizer there can be loaded by the harness and by a runtime.
    files_dir: str | None = None


def survey(model: ModelSpec, source: str) -> CheckpointSurvey:
    """Raises a UserError (or a TransientError, for a Hub that does not answer) naming the model's problem."""
    if model.is_local:
        checkpoint = local_checkpoint(Path(source), allow_pickle=model.allow_pickle,
                                      trust_remote_code=model.trust_remote_code)
        directory = Path(source)
        return CheckpointSurvey(
            commit_sha=checkpoint.commit_sha, weight_files=_weight_files(f.path for f in checkpoint.files),
            parameters=checkpoint.parameter_count, parameters_from="safetensors headers",
            dtype_bytes=dtype_bytes(read_config(directory)), shape=model_shape(source),
            tokenizer=TokenizerFacts.read((p.name for p in directory.iterdir()),
                                          lambda name: _read_json(directory / name)),
            files_dir=str(directory))
    check_revision(model.revision)
    from huggingface_hub import constants

    try:
        return _offline(model, source) if constants.HF_HUB_OFFLINE else _online(model, source)
    except UserError:
        raise
    except Exception as exc:
        raise hub_error(exc, source, model.revision) from None


def _shape(config: dict[str, Any]) -> ModelShape | None:
    try:
        return ModelShape.from_config(config)
    except (KeyError, TypeError, ValueError):
        return None


def _weight_files(names: Iterable[str]) -> list[str]:
    return [name for name in names if name.endswith((".safetensors", ".bin"))]


def _offline(model: ModelSpec, repo_id: str) -> CheckpointSurvey:
    where = f"{repo_id}@{model.revision}"
    snapshot = cached_snapshot(repo_id, model.revision)
    cached = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
    index = _read_json(snapshot / SAFETENSORS_INDEX) if SAFETENSORS_INDEX in cached else None
    shards = sorted({str(s) for s in (index or {}).get("weight_map", {}).values()})
    names = needed_files([*cached, *shards], where=where, allow_pickle=model.allow_pickle,
                         read_json=lambda name: _read_json(snapshot / name))
    config = _read_json(snapshot / "config.json")
    refuse_remote_code(config, cached, where=where, trust_remote_code=model.trust_remote_code)
    value_bytes = dtype_bytes(config)
    total_size = ((index or {}).get("metadata") or {}).get("total_size")
    parameters, parameters_from = None, "unknown offline"
    if total_size:
        parameters, parameters_from = int(total_size) // value_bytes, f"index total_size / {value_bytes} bytes"
    elif "model.safetensors" in cached:
        from enginesmith.core.checkpoints.inspect import safetensors_parameter_count

        parameters, parameters_from = safetensors_parameter_count(snapshot / "model.safetensors"), "safetensors header"
    notes = [] if all(name in cached for name in names) else [
        "offline: shards not in the cache are taken as the index names them (not listed on the Hub)"]
    return CheckpointSurvey(commit_sha=snapshot.name, weight_files=_weight_files(names),
                            parameters=parameters, parameters_from=parameters_from, dtype_bytes=value_bytes,
                            shape=model_shape(str(snapshot)), notes=notes,
                            tokenizer=TokenizerFacts.read(cached, lambda name: _read_json(snapshot / name)),
                            files_dir=str(snapshot))


def _online(model: ModelSpec, repo_id: str) -> CheckpointSurvey:
    from huggingface_hub import HfApi, hf_hub_download

    token = hf_token()
    where = f"{repo_id}@{model.revision}"
    api = HfApi(token=token)
    info = api.model_info(repo_id, revision=model.revision)
    sha = info.sha
    assert sha is not None

    def download(name: str) -> Path:
        return Path(hf_hub_download(repo_id, name, revision=sha, token=token))

    def read_json(name: str) -> Any:
        return _read_json(download(name))

    repo_files = [s.rfilename for s in info.siblings or []]
    names = needed_files(repo_files, where=where, allow_pickle=model.allow_pickle, read_json=read_json)
    config = read_json("config.json")
    refuse_remote_code(config, repo_files, where=where, trust_remote_code=model.trust_remote_code)
    parameters = None
    if any(name.endswith(".safetensors") for name in names):
        counts = api.get_safetensors_metadata(repo_id, revision=sha).parameter_count
        parameters = sum(counts.values())
    return CheckpointSurvey(commit_sha=sha, weight_files=_weight_files(names),
                            parameters=parameters, parameters_from="safetensors headers on the Hub",
                            dtype_bytes=dtype_bytes(config), shape=_shape(config),
                            tokenizer=TokenizerFacts.read(repo_files, read_json),
                            files_dir=str(download("config.json").parent))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path.name}: {exc}", where=str(path)) from None
