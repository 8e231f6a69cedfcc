"""Errors the registry raises. All are ``UserError``s: the CLI prints them without a traceback."""

from __future__ import annotations

from enginesmith.core.errors import TransientError, UserError


class NotFoundError(UserError):
    """A model, manifest, channel or blob that the registry does not have."""


class IntegrityError(UserError):
    """Bytes that do not match their sha256, or an artefact directory that contradicts its ``artefact.json``."""


class UnsafePathError(IntegrityError):
    """A manifest or artefact path that would land outside its directory."""


class SignatureError(IntegrityError):
    """A signature that is missing where trust is required, damaged, by a key not trusted, or over other content."""


class ForeignRecordError(IntegrityError):
    """A record the registry holds that enginesmith did not write (another tool's OCI artifact under a model's
    repository): named where it is met, skipped by listings and gc, never read as one of ours."""


class WithdrawnError(UserError):
    """An artefact whose withdrawal counts (``registry.withdrawals``), asked for by key or through a channel."""


class ReadOnlyStoreError(UserError):
    """A write to a store that cannot be written (a bundle)."""


class RegistryUnavailableError(TransientError):
    """The storage stopped answering (server down, connection reset, timeout, a 5xx): the flows retry it with
    backoff, and the CLI exits 1 (not bad input)."""
