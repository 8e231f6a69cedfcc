"""Names in the registry and where they live.

Every backend stores the same layout (design.md §5), as ``/``-separated paths under its root:

```
blobs/sha256/<hex>                every file, once
manifests/<model>/<key>.json      immutable
refs/<model>/<channel>            mutable aliases (latest, stable), compare-and-swap
stages/<stage>/<key>.json         immutable: a stage's output handed from the node that made it to the next
history/<model>/<entry>.json      immutable, append-only: one cell run's outcome or one channel move
                                  (``registry.history``); never listed as artefacts, never collected by gc
```

A reference (``REF``) names one manifest: ``MODEL@KEY`` (a key or a unique prefix of one) or
``MODEL:CHANNEL``. A bare ``MODEL`` names no manifest; the resolver picks one.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from enginesmith.core.errors import UserError

# Model ids, keys and channels become path components on disk and in object keys: one safe component each.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_UNSAFE_FILE_CHARS = re.compile(r"[^A-Za-z0-9._-]+")
MIN_KEY_PREFIX = 6

BLOBS_DIR = "blobs/sha256"
MANIFESTS_DIR = "manifests"
REFS_DIR = "refs"
STAGES_DIR = "stages"
HISTORY_DIR = "history"
MANIFEST_SUFFIX = ".json"


def is_name(value: str) -> bool:
    return bool(_NAME.match(value))


def check_name(value: str, what: str) -> str:
    """``value`` if it is a valid model id, key or channel; raises ``UserError`` naming ``what`` otherwise."""
    if not is_name(value):
        raise UserError(
            f"{value!r} is not a valid {what}",
            where=what,
            hint="use letters, digits, '.', '_' and '-' (at most 128, starting with a letter or digit)",
        )
    return value


def safe_file_name(text: str) -> str:
    """``text`` (a model id, key, cell id, metric name) as one file name component, the same for every writer (the
    catalogue, the history plots): ``text`` itself when it is a registry name (letters, digits, '.', '_', '-');
    otherwise its safe characters (each unsafe run as '-', at most 60) and 10 hex digits of the sha256 of the
    whole. So two ids never share a file (``a/b``, ``a_b`` and ``a-b`` are three names) and none escapes its
    folder."""
    if is_name(text):
        return text
    stem = _UNSAFE_FILE_CHARS.sub("-", text).strip(".-")[:60] or "x"
    return f"{stem}-{hashlib.sha256(text.encode()).hexdigest()[:10]}"


def is_digest(value: str) -> bool:
    """A sha256 digest as the registry writes it: 64 lower-case hex digits."""
    return bool(_DIGEST.match(value))


def blob_path(digest: str) -> str:
    if not is_digest(digest):
        raise ValueError(f"not a sha256 hex digest: {digest!r}")
    return f"{BLOBS_DIR}/{digest}"


def manifest_dir(model: str) -> str:
    return f"{MANIFESTS_DIR}/{check_name(model, 'model')}"


def manifest_path(model: str, key: str) -> str:
    return f"{manifest_dir(model)}/{check_name(key, 'key')}{MANIFEST_SUFFIX}"


def stage_dir(stage: str) -> str:
    return f"{STAGES_DIR}/{check_name(stage, 'stage')}"


def stage_path(stage: str, key: str) -> str:
    return f"{stage_dir(stage)}/{check_name(key, 'key')}{MANIFEST_SUFFIX}"


def history_dir(model: str) -> str:
    return f"{HISTORY_DIR}/{check_name(model, 'model')}"


def history_path(model: str, entry: str) -> str:
    return f"{history_dir(model)}/{check_name(entry, 'history entry')}{MANIFEST_SUFFIX}"


def refs_dir(model: str) -> str:
    return f"{REFS_DIR}/{check_name(model, 'model')}"


def ref_path(model: str, channel: str) -> str:
    return f"{refs_dir(model)}/{check_name(channel, 'channel')}"


@dataclass(frozen=True)
class Ref:
    """What a user typed to name artefacts: a model, optionally narrowed to one key (prefix) or one channel."""

    model: str
    key: str | None = None
    channel: str | None = None

    @property
    def names_one_manifest(self) -> bool:
        return self.key is not None or self.channel is not None

    def __str__(self) -> str:
        if self.key is not None:
            return f"{self.model}@{self.key}"
        if self.channel is not None:
            return f"{self.model}:{self.channel}"
        return self.model


def parse_ref(text: str, *, where: str = "REF") -> Ref:
    """``MODEL``, ``MODEL@KEY`` or ``MODEL:CHANNEL`` → ``Ref``; raises ``UserError`` naming ``where``."""
    hint = "write MODEL, MODEL@KEY (a key or a unique prefix of one) or MODEL:CHANNEL, e.g. tiny-llama:stable"
    if "@" in text:
        model, _, key = text.partition("@")
        if not is_name(model) or not is_name(key):
            raise UserError(f"{text!r} is not a valid reference", where=where, hint=hint)
        if len(key) < MIN_KEY_PREFIX:
            raise UserError(f"key prefix {key!r} is too short", where=where,
                            hint=f"give at least {MIN_KEY_PREFIX} characters of the key")
        return Ref(model=model, key=key)
    if ":" in text:
        model, _, channel = text.partition(":")
        if not is_name(model) or not is_name(channel):
            raise UserError(f"{text!r} is not a valid reference", where=where, hint=hint)
        return Ref(model=model, channel=channel)
    if not is_name(text):
        raise UserError(f"{text!r} is not a valid model id or reference", where=where, hint=hint)
    return Ref(model=text)
