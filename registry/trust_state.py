"""What this node has seen of each registry: the highest statement sequence per model and channel, so a channel
moved back to an older (genuinely signed) statement is refused, and each trusted withdrawal, so a build stays
withdrawn here after its record is deleted from the store.

Both are kept under the registry's identity (``RegistryStore.identity``: a local directory's resolved path, not the
spelling of one command line). A state written before identities were used keyed it by the location as typed; such
an entry is folded into the identity the first time that spelling is used again (taking the higher sequences, so
an old spelling can only make this node stricter).

One small JSON file per user or node (``ENGINESMITH_TRUST_STATE``, default
``$XDG_STATE_HOME/enginesmith/trust-state.json``), read and rewritten under an exclusive lock, replaced atomically.
A file that cannot be read or written is an error naming it: never a reason to check less.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ValidationError

from enginesmith.core.errors import UserError

STATE_ENV = "ENGINESMITH_TRUST_STATE"


class RememberedWithdrawal(BaseModel):
    """A trusted withdrawal as this node saw it (``registry.withdrawals``)."""

    manifest_digest: str
    reason: str
    issued: datetime
    signer_fingerprint: str  # the trusted key's, so that a trust file that renames or drops it is followed


class TrustState(BaseModel):
    version: int = 2
    seen: dict[str, dict[str, int]] = {}  # registry identity → "model:channel" → highest sequence
    withdrawn: dict[str, dict[str, RememberedWithdrawal]] = {}  # registry identity → "model@key" → the withdrawal

    def highest(self, registry: str, model: str, channel: str) -> int | None:
        return self.seen.get(registry, {}).get(f"{model}:{channel}")

    def saw(self, registry: str, model: str, channel: str, sequence: int) -> None:
        channels = self.seen.setdefault(registry, {})
        name = f"{model}:{channel}"
        channels[name] = max(sequence, channels.get(name, sequence))

    def adopt(self, spelling: str, identity: str) -> None:
        """Fold what a state from before identities kept under ``spelling`` (a registry location as typed) into
        ``identity``."""
        if spelling == identity or spelling not in self.seen:
            return
        for name, sequence in self.seen.pop(spelling).items():
            model, channel = name.split(":", 1)
            self.saw(identity, model, channel, sequence)

    def remembered_withdrawals(self, registry: str, model: str) -> dict[str, RememberedWithdrawal]:
        """Artefact key → the trusted withdrawal this node has seen of ``model``'s build in ``registry``."""
        prefix = f"{model}@"
        return {name.removeprefix(prefix): found for name, found in self.withdrawn.get(registry, {}).items()
                if name.startswith(prefix)}

    def remember_withdrawal(self, registry: str, model: str, key: str, withdrawal: RememberedWithdrawal) -> None:
        self.withdrawn.setdefault(registry, {}).setdefault(f"{model}@{key}", withdrawal)


def default_state_path() -> Path:
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "enginesmith" / "trust-state.json"


@contextmanager
def trust_state(path: Path | None = None) -> Iterator[TrustState]:
    """The state at ``path`` (default: ``default_state_path()``), held under an exclusive lock; what the block leaves
    in it is written back atomically when the block ends without an error."""
    path = path or default_state_path()
    hint = f"fix or remove {path} (a removed state forgets what this node has seen), or set {STATE_ENV}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = (path.parent / f".{path.name}.lock").open("a")
    except OSError as exc:
        raise UserError(f"the trust state cannot be written: {exc.strerror}", where=str(path), hint=hint) from None
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = _read(path, hint)
        before = state.model_dump()
        yield state
        if state.model_dump() != before:
            _write(path, state, hint)


def _read(path: Path, hint: str) -> TrustState:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return TrustState()
    except OSError as exc:
        raise UserError(f"the trust state cannot be read: {exc.strerror}", where=str(path), hint=hint) from None
    try:
        return TrustState.model_validate(json.loads(text))
    except (ValueError, ValidationError):
        raise UserError("the trust state is corrupt (not the JSON this version writes)", where=str(path),
                        hint=hint) from None


def _write(path: Path, state: TrustState, hint: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(state.model_dump_json(indent=1) + "\n")
        with partial.open("rb") as written:
            os.fsync(written.fileno())
        partial.replace(path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise UserError(f"the trust state cannot be written: {exc.strerror}", where=str(path), hint=hint) from None
