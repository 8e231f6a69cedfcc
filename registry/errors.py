"""Errors the registry raises. All are ``UserError``s: the CLI prints them without a traceback."""

from __future__ import annotations

from enginesmith.errors import UserError


class NotFoundError(UserError):
    """A model, manifest, channel or blob that the registry does not have."""


class IntegrityError(UserError):
    """Bytes that do not match their sha256, or an artefact directory that contradicts its ``artefact.json``."""


class UnsafePathError(IntegrityError):
    """A manifest or artefact path that would land outside its directory."""


class ReadOnlyStoreError(UserError):
    """A write to a store that cannot be written (a bundle)."""


class RegistryUnavailableError(UserError):
    """The storage stopped answering (server down, connection reset, timeout).

    Not bad input, so the exit code differs from other user errors: scripts may retry on 1, not on 2.
    """

    exit_code = 1
