"""Withdrawn builds: a signed word that an artefact must not be deployed any more, short of deleting it (as PyPI
yanks a release).

A withdrawal is an in-toto statement in a DSSE envelope (as channel statements are, ``registry.statements``) naming
the model, the artefact key, the reason and when, signed by the withdrawer's key, and kept as a history record
``withdrawal-<key hash>-<its own hash>``: created once, never deleted, so ``gc`` keeps it on every store. Read with a
trust list, only a withdrawal a trusted (and then unrevoked) key signed counts, and the others are named as ignored;
read without one, every readable withdrawal counts (a pull without --trust believes the registry).

A node that reads with a trust list remembers each withdrawal that counts in its trust state (``registry.trust_state``,
under the registry's identity), as it remembers channel sequences: a withdrawal record deleted from the store does not
make the build pullable here again. Through a channel whose trust-file entry lists its signers, only a withdrawal by
one of them counts (``Withdrawals.through``): a key trusted for ``canary`` cannot withdraw what ``prod`` serves.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone

from pydantic import BaseModel, ConfigDict, ValidationError

from registry.errors import NotFoundError
from registry.history import WITHDRAWAL_ENTRY_PREFIX
from registry.signing import SigningKey, Trust, revoked_since
from registry.statements import in_toto_statement, manifest_digest, open_envelope, sign_envelope, verified_signer
from registry.store import RegistryStore
from registry.trust_state import RememberedWithdrawal, trust_state

PREDICATE_TYPE = "https://enginesmith.dev/withdrawal/v1"


class Withdrawal(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    key: str
    manifest_digest: str
    reason: str
    issued: datetime


class Withdrawn(BaseModel):
    """A withdrawal that counts: what it says and who signed it (``None``: read without a trust list)."""

    withdrawal: Withdrawal
    signer: str | None
    signer_fingerprint: str | None = None

    @property
    def describe(self) -> str:
        by = f"by {self.signer}" if self.signer else "signer not checked"
        return f"withdrawn {self.withdrawal.issued.isoformat(timespec='seconds')} ({by}): {self.withdrawal.reason}"


class Withdrawals(BaseModel):
    withdrawn: dict[str, Withdrawn] = {}  # artefact key → the first withdrawal of it that counts
    ignored: list[str] = []  # withdrawals that do not count, and why

    def reasons(self) -> dict[str, str]:
        return {key: found.describe for key, found in self.withdrawn.items()}

    def through(self, channel: str, trust: Trust | None) -> Withdrawals:
        """The withdrawals that count for a pull through ``channel``: under a trust list that names the channel's
        signers, only theirs (the others are named as ignored)."""
        allowed = trust.channel_signers.get(channel) if trust is not None else None
        if not allowed:
            return self
        kept = {key: found for key, found in self.withdrawn.items() if found.signer in allowed}
        ignored = [f"the withdrawal of {key[:12]} ({found.withdrawal.reason!r}) is signed by {found.signer}; channel "
                   f"{channel!r} allows {', '.join(allowed)}"
                   for key, found in self.withdrawn.items() if key not in kept]
        return Withdrawals(withdrawn=kept, ignored=self.ignored + ignored)


def withdrawal_entry(key: str, body: bytes) -> str:
    return (f"{WITHDRAWAL_ENTRY_PREFIX}{hashlib.sha256(key.encode()).hexdigest()[:16]}-"
            f"{hashlib.sha256(body).hexdigest()[:12]}")


def withdraw(store: RegistryStore, model: str, key: str, reason: str, signing_key: SigningKey, *,
             now: datetime | None = None) -> Withdrawal:
    """Publish a signed withdrawal of ``model@key``; raises ``NotFoundError`` for an artefact the store lacks."""
    body = store.read_manifest(model, key)
    if body is None:
        raise NotFoundError(f"no artefact {model}@{key} to withdraw", where=store.location,
                            hint=f"enginesmith ls {model} lists its keys")
    withdrawal = Withdrawal(model=model, key=key, manifest_digest=manifest_digest(body), reason=reason,
                            issued=now or datetime.now(timezone.utc))
    statement = in_toto_statement(f"{model}@{key}", withdrawal.manifest_digest, PREDICATE_TYPE,
                                  withdrawal.model_dump(mode="json"))
    envelope = sign_envelope(statement, signing_key)
    store.create_history(model, withdrawal_entry(key, envelope), envelope)
    return withdrawal


def read_withdrawals(store: RegistryStore, model: str, trust: Trust | None, *, remember: bool = False) -> Withdrawals:
    """The withdrawals of ``model``'s artefacts that count under ``trust``, with those this node remembers (see the
    module's docstring); ``remember``: keep the ones found in the node's trust state (a pull, not a page)."""
    found = _stored_withdrawals(store, model, trust)
    if trust is None:
        return found
    with trust_state() as state:
        for key, seen in state.remembered_withdrawals(store.identity, model).items():
            signer = trust.named(seen.signer_fingerprint)
            if key in found.withdrawn or signer is None or revoked_since(trust, signer.name, seen.issued) is not None:
                continue
            withdrawal = Withdrawal(model=model, key=key, manifest_digest=seen.manifest_digest,
                                    reason=f"{seen.reason} (remembered by this node: its record is gone from the "
                                           "registry)", issued=seen.issued)
            found.withdrawn[key] = Withdrawn(withdrawal=withdrawal, signer=signer.name,
                                             signer_fingerprint=signer.fingerprint)
        for key, counted in found.withdrawn.items() if remember else ():
            assert counted.signer_fingerprint is not None
            state.remember_withdrawal(store.identity, model, key, RememberedWithdrawal(
                manifest_digest=counted.withdrawal.manifest_digest, reason=counted.withdrawal.reason,
                issued=counted.withdrawal.issued, signer_fingerprint=counted.signer_fingerprint))
    return found


def _stored_withdrawals(store: RegistryStore, model: str, trust: Trust | None) -> Withdrawals:
    found = Withdrawals()
    for entry in sorted(e for e in store.list_history(model) if e.startswith(WITHDRAWAL_ENTRY_PREFIX)):
        body = store.read_history(model, entry)
        if body is None:
            continue
        envelope, statement, problem = open_envelope(body, PREDICATE_TYPE)
        withdrawal = None
        if statement is not None:
            try:
                withdrawal = Withdrawal.model_validate(statement.get("predicate"))
            except ValidationError:
                problem = "not a withdrawal"
        if withdrawal is None or withdrawal.model != model:
            found.ignored.append(f"{entry}: {problem or f'a withdrawal of {withdrawal and withdrawal.model}'}")
            continue
        signer = fingerprint = None
        if trust is not None:
            trusted = verified_signer(envelope, trust)
            if trusted is None:
                found.ignored.append(f"the withdrawal of {withdrawal.key[:12]} ({withdrawal.reason!r}) is not signed "
                                     f"by a trusted key ({trust.names})")
                continue
            if revoked_since(trust, trusted.name, withdrawal.issued) is not None:
                found.ignored.append(f"the withdrawal of {withdrawal.key[:12]} is signed by {trusted.name}, revoked "
                                     "before it was made")
                continue
            signer, fingerprint = trusted.name, trusted.fingerprint
        found.withdrawn.setdefault(withdrawal.key, Withdrawn(withdrawal=withdrawal, signer=signer,
                                                             signer_fingerprint=fingerprint))
    return found
