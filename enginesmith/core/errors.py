"""User-facing errors: they say what was wrong, where, and what to do.

The CLI prints a ``UserError`` without a traceback and exits with code 2 (a traceback only with ``--debug``).
"""

from __future__ import annotations

from pathlib import Path


class UserError(Exception):
    """Bad input from the user: a config, an argument, a file.

    ``where`` names the file (and line) or the field path; ``hint`` says what to do about it.
    """

    exit_code = 2

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None) -> None:
        self.message = message
        self.where = where
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class ConfigError(UserError):
    """A config file that does not parse or does not match the schema."""

    def __init__(
        self,
        message: str,
        *,
        path: Path | str | None = None,
        line: int | None = None,
        field: str | None = None,
        hint: str | None = None,
    ) -> None:
        self.path = str(path) if path is not None else None
        self.line = line
        self.field = field
        parts = []
        if self.path:
            parts.append(f"{self.path}:{line}" if line else self.path)
        if field:
            parts.append(field)
        super().__init__(message, where=": ".join(parts) or None, hint=hint)


class IncompatibleError(UserError):
    """A request that the planning rules refuse (recipe on this SM, tp on this node, ...)."""


class TransientError(UserError):
    """A failure worth retrying as it is (a network error, an HTTP 5xx, a timeout, a server that did not become
    healthy for a reason outside the artefact): flows retry these, and never a deterministic one (a bad config,
    out of memory, a flag the runtime rejects, a failed gate). The CLI exits 1, so scripts may retry on 1, not 2."""

    exit_code = 1


def os_failure(error: OSError, *, doing: str, where: str | None = None, hint: str | None = None) -> UserError:
    """An ``OSError`` (permission, read-only filesystem, immutable file, not a directory, name too long, ...) as one
    line: what was being done, why it failed, and the path or paths the system named."""
    paths = " -> ".join(str(name) for name in (error.filename, error.filename2) if name is not None)
    reason = error.strerror or str(error) or type(error).__name__
    return UserError(f"{doing} failed: {reason}" + (f": {paths}" if paths else ""), where=where, hint=hint)
