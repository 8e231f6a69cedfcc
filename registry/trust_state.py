"""What this node has seen of each channel: the highest statement sequence per registry, model and channel, so a
channel moved back to an older (genuinely signed) statement is refused.

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
from pathlib import Path

from pydantic import BaseModel, ValidationError

from enginesmith.core.errors import UserError

STATE_ENV = "ENGINESMITH_TRUST_STATE"


class TrustState(BaseModel):
    version: int = 1
    seen: dict[str, dict[str, int]] = {}  # registry location → "model:channel" → highest sequence

    def highest(self, registry: str, model: str, channel: str) -> int | None:
        return self.seen.get(registry, {}).get(f"{model}:{channel}")

    def saw(self, registry: str, model: str, channel: str, sequence: int) -> None:
        channels = self.seen.setdefault(registry, {})
        name = f"{model}:{channel}"
        channels[name] = max(sequence, channels.get(name, sequence))


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
