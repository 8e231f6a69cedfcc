"""Signed channel statements: what a promoter says a channel points at, in a form no writer of the storage can roll
back, freeze or move to another model.

A statement is an in-toto Statement (v1) in a DSSE envelope, as model-signing's bundles are: its subject is the
manifest the channel points at (``model@key`` with the manifest's sha256), its predicate the registry it was made
in (its identity, ``RegistryStore.identity``), the model, the channel, the artefact key, a sequence number that only
grows per registry, model and channel, when it was issued and when it expires. It is
signed with the promoter's key (securesystemslib's DSSE over a ``cryptography`` key, the key ``publish --sign-key``
loads). ``check_statement`` is pure: it takes what the pull knows (the trust list, the pointer it read, the highest
sequence this node has seen, the time) and says which check failed, if any.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from registry.signing import SigningKey, Trust, TrustedKey, revoked_since

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://enginesmith.dev/channel-statement/v1"
MAX_STATEMENT_BYTES = 64 * 1024


class ChannelClaim(BaseModel):
    """What a statement says: in registry ``registry``, ``model:channel`` is artefact ``key`` (manifest sha256
    ``manifest_digest``), the ``sequence``-th statement for that channel, issued at ``issued`` and good until
    ``expires``. A statement from before statements named their registry has ``registry`` None: no pull takes it,
    since nothing says it was not copied from another registry whose sequences run higher."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    registry: str | None = None
    model: str
    channel: str
    key: str
    manifest_digest: str
    sequence: int
    issued: datetime
    expires: datetime


Failure = Literal["missing", "unreadable", "untrusted-signer", "revoked-signer", "signer-not-allowed",
                  "other-model-or-channel", "other-registry", "not-the-pointer", "expired", "rolled-back"]
# In the order check_statement runs them, as the refusal's table lists them.
CHECKS: tuple[tuple[Failure, str], ...] = (
    ("missing", "the channel has a statement"),
    ("unreadable", "a DSSE envelope of an in-toto channel statement"),
    ("untrusted-signer", "signed by a trusted key"),
    ("revoked-signer", "its signer not revoked when it signed"),
    ("signer-not-allowed", "a signer the channel allows"),
    ("other-model-or-channel", "about this model and channel"),
    ("other-registry", "made in this registry"),
    ("not-the-pointer", "names the artefact the channel points at"),
    ("expired", "not expired"),
    ("rolled-back", "no older than the newest this node has seen"),
)


class StatementCheck(BaseModel):
    """The outcome of checking one statement: ``failed`` names the check (None: it holds), ``detail`` says why."""

    claim: ChannelClaim | None = None
    signer: str | None = None  # the trusted key's name
    failed: Failure | None = None
    detail: str = ""

    @property
    def holds(self) -> bool:
        return self.failed is None


def manifest_digest(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def sign_statement(claim: ChannelClaim, key: SigningKey) -> bytes:
    """The DSSE envelope (JSON) of ``claim`` as an in-toto statement, signed with ``key``."""
    return sign_envelope(_statement(claim), key)


def sign_envelope(statement: dict[str, Any], key: SigningKey) -> bytes:
    """An in-toto ``statement`` in a DSSE envelope (JSON) signed with ``key``."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner

    payload = json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()
    envelope = Envelope(payload=payload, payload_type=PAYLOAD_TYPE, signatures={})
    envelope.sign(CryptoSigner(key.private_key))
    return json.dumps(envelope.to_dict(), sort_keys=True, indent=1).encode() + b"\n"


def _statement(claim: ChannelClaim) -> dict[str, Any]:
    return in_toto_statement(f"{claim.model}@{claim.key}", claim.manifest_digest, PREDICATE_TYPE,
                             claim.model_dump(mode="json"))


def in_toto_statement(subject: str, sha256: str, predicate_type: str, predicate: dict[str, Any]) -> dict[str, Any]:
    return {"_type": STATEMENT_TYPE, "subject": [{"name": subject, "digest": {"sha256": sha256}}],
            "predicateType": predicate_type, "predicate": predicate}


def check_statement(body: bytes, trust: Trust, *, registry: str, model: str, channel: str, pointer_key: str,
                    pointer_digest: str, highest_seen: int | None, now: datetime) -> StatementCheck:
    """Is ``body`` a statement that in ``registry`` (its identity) ``model:channel`` is ``pointer_key`` (manifest
    sha256 ``pointer_digest``), signed by a key the channel allows, not expired at ``now``, and no older than the
    highest sequence this node has seen for that registry, model and channel? The first check that fails is named."""
    envelope, claim, problem = _read(body)
    if claim is None or envelope is None:
        return StatementCheck(failed="unreadable", detail=problem)
    signer = verified_signer(envelope, trust)
    if signer is None:
        return StatementCheck(claim=claim, failed="untrusted-signer",
                              detail=f"not signed by a trusted key ({trust.names or 'none'})")
    revoked_at = revoked_since(trust, signer.name, claim.issued)
    if revoked_at is not None:
        return StatementCheck(claim=claim, signer=signer.name, failed="revoked-signer",
                              detail=f"signed by {signer.name} at {claim.issued.isoformat(timespec='seconds')}, "
                                     f"revoked {revoked_at.isoformat(timespec='seconds')}")
    allowed = trust.channel_signers.get(channel)
    if allowed and signer.name not in allowed:
        return StatementCheck(claim=claim, signer=signer.name, failed="signer-not-allowed",
                              detail=f"signed by {signer.name}; channel {channel!r} allows {', '.join(allowed)}")
    if (claim.model, claim.channel) != (model, channel):
        return StatementCheck(claim=claim, signer=signer.name, failed="other-model-or-channel",
                              detail=f"the statement is about {claim.model}:{claim.channel}, not {model}:{channel}")
    if claim.registry != registry:
        return StatementCheck(claim=claim, signer=signer.name, failed="other-registry",
                              detail=f"the statement was made in {claim.registry}, not {registry}"
                              if claim.registry else "the statement names no registry (made before statements "
                                                     "named theirs): it may come from another registry")
    if (claim.key, claim.manifest_digest) != (pointer_key, pointer_digest):
        return StatementCheck(claim=claim, signer=signer.name, failed="not-the-pointer",
                              detail=f"the statement names {claim.key[:12]}, the channel points at {pointer_key[:12]}"
                              if claim.key != pointer_key else "the manifest changed after the statement was signed")
    if now >= claim.expires:
        return StatementCheck(claim=claim, signer=signer.name, failed="expired",
                              detail=f"expired {claim.expires.isoformat(timespec='seconds')} (issued "
                                     f"{claim.issued.isoformat(timespec='seconds')}): the channel may be frozen")
    if highest_seen is not None and claim.sequence < highest_seen:
        return StatementCheck(claim=claim, signer=signer.name, failed="rolled-back",
                              detail=f"sequence {claim.sequence}, but this node has seen {highest_seen} for "
                                     f"{model}:{channel}: the channel was moved back")
    return StatementCheck(claim=claim, signer=signer.name)


def _read(body: bytes) -> tuple[Any, ChannelClaim | None, str]:
    envelope, statement, problem = open_envelope(body, PREDICATE_TYPE)
    if statement is None:
        return None, None, problem
    try:
        claim = ChannelClaim.model_validate(statement["predicate"])
    except (KeyError, ValidationError) as exc:
        return None, None, f"not a channel statement ({type(exc).__name__})"
    if statement.get("subject") != _statement(claim)["subject"]:
        return None, None, "its subject does not match its predicate"
    return envelope, claim, ""


def read_claim(body: bytes) -> ChannelClaim | None:
    """What a statement says, read without checking who signed it (a promoter finding the sequence to follow)."""
    return _read(body)[1]


def open_envelope(body: bytes, predicate_type: str) -> tuple[Any, dict[str, Any] | None, str]:
    """The DSSE envelope and the in-toto statement of ``predicate_type`` inside ``body``, unverified; or ``None``
    and what is wrong with it."""
    from securesystemslib.dsse import Envelope

    if len(body) > MAX_STATEMENT_BYTES:
        return None, None, f"{len(body)} bytes, more than a statement holds ({MAX_STATEMENT_BYTES})"
    try:
        envelope = Envelope.from_dict(json.loads(body))
        if envelope.payload_type != PAYLOAD_TYPE:
            return None, None, f"payload type {envelope.payload_type!r}, not {PAYLOAD_TYPE}"
        statement = json.loads(envelope.payload)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # JSON, DSSE, base64
        return None, None, f"not a DSSE envelope ({type(exc).__name__})"
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE \
            or statement.get("predicateType") != predicate_type:
        return None, None, f"not an in-toto statement of {predicate_type}"
    return envelope, statement, ""


def verified_signer(envelope: Any, trust: Trust) -> TrustedKey | None:
    """The trusted key whose signature over the envelope verifies, if any."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key
    from securesystemslib.exceptions import VerificationError
    from securesystemslib.signer import SSlibKey

    for trusted in trust.keys:
        public = SSlibKey.from_crypto(load_pem_public_key(trusted.pem))
        try:
            envelope.verify([public], 1)
        except VerificationError:
            continue
        return trusted
    return None


def new_claim(*, registry: str, model: str, channel: str, key: str, manifest_body: bytes, previous: int | None,
              now: datetime, valid_for: timedelta) -> ChannelClaim:
    """The next statement's claim for ``model:channel`` in ``registry`` (its identity): its sequence one above the
    last one written (``previous``; None: the first)."""
    return ChannelClaim(registry=registry, model=model, channel=channel, key=key,
                        manifest_digest=manifest_digest(manifest_body),
                        sequence=(previous or 0) + 1, issued=now, expires=now + valid_for)
