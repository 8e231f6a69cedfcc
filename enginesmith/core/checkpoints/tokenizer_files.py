"""What a checkpoint's tokenizer files say against its model files, read as JSON (no transformers, no torch), so the
same reading applies to a local directory, a Hub cache snapshot and a Hub listing.

Two defects a hand-converted checkpoint carries and no stage notices, because every request still gets an answer:
- the tokenizer's end-of-sequence token is not the one ``generation_config.json`` (else ``config.json``) stops at:
  transformers' ``generate`` (the harness) stops at the generation config's ids, the servers at the tokenizer's as
  well, so the two sides end their answers at different tokens;
- tokens that look like control tokens (``<|fim_prefix|>``, ``<tool_call>``) sit in the vocabulary without being
  registered as added tokens: the tokenizer then reads their text as ordinary pieces, so a prompt that writes one
  (fill-in-the-middle, a tool call, a chat template) never produces its id.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

# ``<|name|>`` (Qwen, Llama 3, Phi) and ``<name_with_underscores>`` (``<tool_call>``, ``<start_of_turn>``): shapes a
# byte-level pre-tokenizer splits, so a merge never makes them and only registration does. HTML-like tags without an
# underscore (``<div>``, ``<td>``) are ordinary vocabulary in code-trained tokenizers and are not matched.
CONTROL_TOKEN = re.compile(r"^(<\|[^|\s]+\|>|</?[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+>)$")
SPECIAL_TOKEN_FIELDS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
# How many of the unregistered tokens a check names (the count is always given).
NAMED_TOKENS = 6


class TokenizerFiles(BaseModel):
    """The JSON files of a checkpoint that say what its tokenizer is and where generation stops; {} for a file that is
    not there or could not be read."""

    tokenizer: dict[str, Any] = {}  # tokenizer.json
    tokenizer_config: dict[str, Any] = {}
    special_tokens_map: dict[str, Any] = {}
    generation_config: dict[str, Any] = {}
    config: dict[str, Any] = {}

    def token_ids(self) -> dict[str, int]:
        """Every token's id: the model's vocabulary, then tokenizer.json's and tokenizer_config.json's added tokens."""
        ids = dict(_vocabulary(self.tokenizer))
        ids.update(self._registered_ids())
        return ids

    def _registered_ids(self) -> dict[str, int]:
        added = {str(t["content"]): int(t["id"]) for t in self.tokenizer.get("added_tokens") or []
                 if isinstance(t, dict) and "content" in t and "id" in t}
        decoder = self.tokenizer_config.get("added_tokens_decoder") or {}
        for token_id, token in decoder.items() if isinstance(decoder, dict) else []:
            if isinstance(token, dict) and "content" in token and str(token_id).isdigit():
                added.setdefault(str(token["content"]), int(token_id))
        return added

    def registered(self) -> set[str]:
        """The tokens transformers matches whole before pre-tokenising: the added tokens, the named special tokens and
        the additional special tokens (transformers registers the last two on load)."""
        found = set(self._registered_ids())
        for source in (self.tokenizer_config, self.special_tokens_map):
            found.update(filter(None, (_content(source.get(field)) for field in SPECIAL_TOKEN_FIELDS)))
            found.update(filter(None, map(_content, source.get("additional_special_tokens") or [])))
        return found

    def eos_token(self) -> str | None:
        return _content(self.tokenizer_config.get("eos_token")) or _content(self.special_tokens_map.get("eos_token"))


def eos_disagreement(files: TokenizerFiles) -> str | None:
    """Why the tokenizer's end-of-sequence token is not where generation stops (None where they agree, or where the
    files do not say enough to compare: no tokenizer.json vocabulary, no eos_token, no eos_token_id)."""
    eos = files.eos_token()
    ids = files.token_ids()
    if eos is None or not ids:
        return None
    for stated_in, found in (("generation_config.json", files.generation_config), ("config.json", files.config)):
        if found.get("eos_token_id") is not None:
            return _eos_against(eos, ids, stated_in, found["eos_token_id"])
    return None


def _eos_against(eos: str, ids: dict[str, int], stated_in: str, stated: int | list[int]) -> str | None:
    stated_ids = [int(i) for i in (stated if isinstance(stated, list) else [stated])]
    eos_id = ids.get(eos)
    if eos_id in stated_ids:
        return None
    names = {token_id: token for token, token_id in ids.items()}
    stops = ", ".join(f"{i} ({names.get(i, 'not in the vocabulary')!r})" for i in stated_ids)
    tokenizer_side = f"{eos!r} (id {eos_id})" if eos_id is not None else f"{eos!r} (not in the vocabulary)"
    return (f"the tokenizer's eos_token {tokenizer_side} is not {stated_in}'s eos_token_id {stops}: the harness "
            "(transformers' generate) stops at the generation config's ids and the servers at the tokenizer's too, "
            f"so the two sides end answers at different tokens; make {stated_in}'s eos_token_id and "
            "tokenizer_config.json's eos_token name the same token")


def unregistered_control_tokens(files: TokenizerFiles) -> list[tuple[str, int]]:
    """The vocabulary's tokens shaped like control tokens that are not registered (in id order)."""
    registered = files.registered()
    return sorted(((token, token_id) for token, token_id in _vocabulary(files.tokenizer)
                   if CONTROL_TOKEN.match(token) and token not in registered), key=lambda found: found[1])


def describe_unregistered(tokens: list[tuple[str, int]]) -> str:
    named = ", ".join(f"{token!r} ({token_id})" for token, token_id in tokens[:NAMED_TOKENS])
    more = f" and {len(tokens) - NAMED_TOKENS} more" if len(tokens) > NAMED_TOKENS else ""
    return (f"{len(tokens)} control token{'s' if len(tokens) != 1 else ''} in tokenizer.json's vocabulary "
            f"{'are' if len(tokens) != 1 else 'is'} not registered as added or special tokens: {named}{more}; the "
            "tokenizer reads their text as ordinary pieces, so a prompt that writes one (fill-in-the-middle, a tool "
            "call, a chat template) never produces its id; register them in tokenizer.json's added_tokens "
            "(\"special\": true for control tokens)")


def _vocabulary(tokenizer: dict[str, Any]) -> list[tuple[str, int]]:
    """tokenizer.json's model vocabulary as (token, id): a mapping (BPE, WordPiece, WordLevel) or a list of
    [piece, score] (Unigram, ids in order)."""
    vocab = (tokenizer.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        return [(str(token), int(token_id)) for token, token_id in vocab.items()]
    if isinstance(vocab, list):
        return [(str(entry[0]), token_id) for token_id, entry in enumerate(vocab) if isinstance(entry, list) and entry]
    return []


def _content(token: object) -> str | None:
    """A special token as the files write it: a string, or an AddedToken object with its ``content``."""
    if isinstance(token, str):
        return token
    if isinstance(token, dict) and isinstance(token.get("content"), str):
        return str(token["content"])
    return None
