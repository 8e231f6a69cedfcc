"""A channel's signed statements in a store: the next one written before the channel moves (``promote``, and
``publish`` with a signing key), the newest one a trusted key signed checked by a ``--trust`` pull.

Each statement is a history record ``statement-<channel>-<sequence>`` (``registry.history``): created once, so of
two promoters that read the same last sequence exactly one writes the next, and never deleted, so ``gc`` keeps them
on every store. The channel's pointer (the ref) still says where it is; the statement says who put it there, until
when, and in which order, and a pull believes the pointer only where they agree.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

from registry.errors import NotFoundError, SignatureError
from registry.history import STATEMENT_ENTRY_PREFIX as STATEMENT_PREFIX
from registry.signing import SigningKey, Trust
from registry.statements import (
    ChannelClaim,
    StatementCheck,
    check_statement,
    manifest_digest,
    new_claim,
    read_claim,
    sign_statement,
)
from registry.store import RegistryStore
from registry.trust_state import trust_state

DEFAULT_VALID_FOR = timedelta(days=7)
LOOK_BACK = 16  # statements a pull reads past unreadable or untrusted ones before it gives up


def statement_entry(channel: str, sequence: int) -> str:
    return f"{STATEMENT_PREFIX}{channel}-{sequence:012d}"


def statement_sequences(store: RegistryStore, model: str, channel: str) -> list[int]:
    """The sequences of ``model:channel``'s statements the store holds, lowest first."""
    pattern = re.compile(rf"^{re.escape(STATEMENT_PREFIX + channel)}-(\d{{12,}})$")
    found = (pattern.match(entry) for entry in store.list_history(model))
    return sorted(int(match.group(1)) for match in found if match)


def newest_claim(store: RegistryStore, model: str, channel: str) -> ChannelClaim | None:
    """What the channel's newest statement says, read without checking who signed it (a promoter keeping it current,
    a page that reports it unchecked)."""
    sequences = statement_sequences(store, model, channel)
    body = store.read_history(model, statement_entry(channel, sequences[-1])) if sequences else None
    return read_claim(body) if body is not None else None


class ChannelRaceError(SignatureError):
    """Another promote signed the channel's next statement first: this one moved nothing."""


class ChannelStatementError(SignatureError):
    """A ``--trust`` pull through a channel whose statement does not hold; ``check`` says which check failed."""

    def __init__(self, message: str, *, check: StatementCheck, skipped: list[str], where: str, hint: str) -> None:
        super().__init__(message, where=where, hint=hint)
        self.check = check
        self.skipped = skipped


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class ChannelSigner:
    """Signs a channel's next statement with ``key``, good for ``valid_for``."""

    store: RegistryStore
    key: SigningKey
    valid_for: timedelta = DEFAULT_VALID_FOR
    clock: Callable[[], datetime] = field(default=_utc_now)

    def sign(self, model: str, channel: str, key: str) -> ChannelClaim | None:
        """Write the statement that ``model:channel`` is ``key``, one above the last sequence; ``None`` when another
        writer took that sequence first (nothing written)."""
        body = self.store.read_manifest(model, key)
        if body is None:
            raise NotFoundError(f"no artefact {model}@{key}", where=self.store.location)
        sequences = statement_sequences(self.store, model, channel)
        claim = new_claim(registry=self.store.identity, model=model, channel=channel, key=key, manifest_body=body,
                          previous=sequences[-1] if sequences else None, now=self.clock(), valid_for=self.valid_for)
        created = self.store.create_history(model, statement_entry(channel, claim.sequence),
                                            sign_statement(claim, self.key))
        return claim if created else None

    def settle(self, model: str, channel: str, key: str) -> ChannelClaim | None:
        """Sign the channel's statement again where the newest does not name ``key`` (what the pointer names) or this
        registry, or has less than half its time left: a publish that leaves ``latest`` where it is keeps its
        statement current."""
        newest = newest_claim(self.store, model, channel)
        if newest is not None and (newest.key, newest.registry) == (key, self.store.identity) \
                and self.clock() < newest.expires - self.valid_for / 2:
            return None
        return self.sign(model, channel, key)


def check_channel(store: RegistryStore, model: str, channel: str, pointer_key: str, trust: Trust, *,
                  state_path: Path | None = None, now: datetime | None = None,
                  remember: bool = True) -> StatementCheck:
    """That the newest statement of ``model:channel`` a trusted key signed holds for the pointer's ``pointer_key``
    (``registry.statements.check_statement``), against the highest sequence this node has seen; records its sequence
    as seen when it holds (unless not ``remember``: a page that only reports). Raises ``ChannelStatementError``
    naming the check that failed."""
    where = f"{store.location}: {model}:{channel}"
    manifest_body = store.read_manifest(model, pointer_key)
    if manifest_body is None:
        raise NotFoundError(f"{model}:{channel} points at {pointer_key}, which is not published", where=where)
    skipped: list[str] = []
    registry = store.identity
    with trust_state(state_path) as state:
        state.adopt(store.location, registry)
        highest = state.highest(registry, model, channel)
        checked = StatementCheck(failed="missing", detail=f"no statement of {model}:{channel} signed by a trusted key")
        for sequence in reversed(statement_sequences(store, model, channel)[-LOOK_BACK:]):
            body = store.read_history(model, statement_entry(channel, sequence)) or b""
            candidate = check_statement(body, trust, registry=registry, model=model, channel=channel,
                                        pointer_key=pointer_key,
                                        pointer_digest=manifest_digest(manifest_body), highest_seen=highest,
                                        now=now or _utc_now())
            if candidate.failed in ("unreadable", "untrusted-signer"):  # a writer of the storage can add those
                skipped.append(f"statement {sequence}: {candidate.detail}")
                continue
            checked = candidate
            break
        if checked.holds and remember:
            assert checked.claim is not None
            state.saw(registry, model, channel, checked.claim.sequence)
    if not checked.holds:
        unbound = checked.failed == "other-registry" and checked.claim is not None and checked.claim.registry is None
        raise ChannelStatementError(
            f"{model}:{channel} is not vouched for: {checked.detail}", check=checked, skipped=skipped,
            where=store.location,
            hint=f"promote it with a signing key here (enginesmith promote {model}@KEY --channel {channel} "
                 f"--sign-key KEY --registry {store.location})" if checked.failed == "missing" or unbound
            else "do not deploy from this channel; ask whoever promotes it")
    return checked

