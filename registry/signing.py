"""Signed artefacts: an OpenSSF model-signing bundle over what a deployment pulls, checked against a trust list.

The bundle is model-signing's own (a sigstore bundle: a DSSE envelope over an in-toto statement of every file's
sha256), so ``model_signing verify key`` checks a pulled directory with no enginesmith installed. What it signs is
the directory as ``pull`` lays it out: the artefact's files, its ``artefact.json`` and, for a signature made by
``publish``, the publication record (model, registry key, artefact key, validation report), so a report or a key
cannot be swapped under a signature either. The pull record and the signature file are named in the signature as
ignored. A signature made by model-signing's CLI before publishing covers the files and ``artefact.json`` only.

Signatures are made and checked from the digests the manifest lists (the blobs are verified against those as they
are fetched), so a pull refuses an untrusted artefact before it fetches a byte. model-signing 1.1.1 is pinned: its
key signer and verifier are used as they are, handed keys loaded here (from a file or an environment variable).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict

from enginesmith.core.artefacts import ARTEFACT_FILE, artefact_record_bytes
from enginesmith.core.errors import UserError
from enginesmith.core.secrets import register_secret
from registry.errors import NotFoundError, SignatureError
from registry.manifest import (
    PUBLICATION_FILE,
    PULL_RECORD_FILE,
    SIGNATURE_FILE,
    Manifest,
    SignatureRef,
    parse_timestamp,
)
from registry.names import is_name
from registry.store import RegistryStore

MAX_SIGNATURE_BYTES = 4 * 1024 * 1024  # a bundle lists one digest per file: kilobytes, even for thousands of files
UNSIGNED_PATHS = (PULL_RECORD_FILE, SIGNATURE_FILE)  # in the pulled directory, outside the signature
_INSTALL_HINT = ("model-signing is part of enginesmith's base install, and this environment lacks it: reinstall "
                 "enginesmith (pip install --force-reinstall enginesmith)")
Covers = Literal["publication-dated", "publication", "artefact"]
SIGNED_AT_PUBLISH: Covers = "publication-dated"


def publication_record_bytes(manifest: Manifest) -> bytes:
    """The publication record as ``pull`` lays it out (``PUBLICATION_FILE``): canonical JSON of what publishing adds
    to the artefact and a signature must pin (the registry key, the validation report and, for a signature that
    covers ``publication-dated``, the publication time that ``latest``, the resolver and ``gc`` order by)."""
    record: dict[str, Any] = {"model": manifest.model, "key": manifest.key, "artefact_key": manifest.artefact.key,
                              "validation": manifest.validation}
    if manifest.signature is None or manifest.signature.covers == "publication-dated":
        record["published"] = manifest.published  # signatures from before it was signed ("publication") lack it
    return (json.dumps(record, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()


def signed_digests(manifest: Manifest, covers: Covers) -> dict[str, str]:
    """Path → sha256 of every file a signature that ``covers`` this much must list, as the pulled directory holds
    them."""
    digests = {entry.path: entry.sha256 or "" for entry in manifest.artefact.files}
    digests[ARTEFACT_FILE] = hashlib.sha256(artefact_record_bytes(manifest.artefact)).hexdigest()
    if covers != "artefact":
        digests[PUBLICATION_FILE] = hashlib.sha256(publication_record_bytes(manifest)).hexdigest()
    return digests


def fingerprint(public_key: Any) -> str:
    """A public key's fingerprint as model-signing's bundles name their key: sha256 of its PEM SubjectPublicKeyInfo."""
    from cryptography.hazmat.primitives import serialization

    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


# --- keys --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SigningKey:
    """A private key loaded for signing; ``source`` says where it came from (a path or an environment variable's
    name), never what it holds."""

    source: str
    private_key: Any = field(repr=False)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.private_key.public_key())


def load_signing_key(*, key_file: Path | None = None, key_env: str | None = None,
                     passphrase_env: str | None = None, where: str = "--sign-key") -> SigningKey:
    """The private key in ``key_file`` or in the environment variable ``key_env`` (PEM), decrypted with the
    passphrase in the environment variable ``passphrase_env`` if given.

    Raises ``UserError`` naming the file or variable: a key file that others may read, a missing or malformed key, a
    key that is not elliptic-curve, a wrong or missing passphrase. The error never holds key or passphrase text.
    """
    _require_model_signing()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if (key_file is None) == (key_env is None):
        raise UserError("give the signing key once: a file or an environment variable", where=where,
                        hint="--sign-key FILE, or --sign-key-env NAME (registry.signing.key_file / key_env)")
    if key_file is not None:
        source = str(key_file)
        try:
            mode = key_file.stat().st_mode
        except FileNotFoundError:
            raise UserError(f"no signing key at {key_file}", where=where,
                            hint="make one: openssl ecparam -name prime256v1 -genkey -noout -out KEY.pem") from None
        except PermissionError:
            raise UserError(f"{key_file} cannot be read by this user", where=where,
                            hint="sign as a user who can read it, or pass its PEM text in --sign-key-env") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UserError(f"{key_file} is readable by other users (mode {stat.S_IMODE(mode):04o}): refusing to sign "
                            "with a private key others can copy", where=where, hint=f"chmod 600 {key_file}")
        try:
            pem = key_file.read_bytes()
        except (PermissionError, IsADirectoryError):
            raise UserError(f"{key_file} cannot be read as a key file", where=where,
                            hint="give the path of the PEM private key, readable by this user") from None
    else:
        assert key_env is not None
        source = f"${key_env}"
        text = os.environ.get(key_env)
        if not text:
            raise UserError(f"the environment variable {key_env} is not set or empty", where=where,
                            hint=f"export {key_env} with the PEM text of the private key")
        pem = text.encode()
    # Scrubbed from every log and error from here on (enginesmith.core.secrets): the key's text, line by line, and its
    # passphrase.
    for line in pem.decode(errors="replace").splitlines():
        if "-----" not in line:
            register_secret(line.strip())
    passphrase = None
    if passphrase_env is not None:
        passphrase_text = register_secret(os.environ.get(passphrase_env))
        if passphrase_text is None:
            raise UserError(f"the environment variable {passphrase_env} (the key's passphrase) is not set",
                            where=where,
                            hint=f"export {passphrase_env}, or drop --passphrase-env for a key without one")
        passphrase = passphrase_text.encode()
    try:
        private_key = serialization.load_pem_private_key(pem, passphrase)
    except TypeError:
        # cryptography: a passphrase for a key without one, or none for an encrypted key
        wants = "is encrypted: give its passphrase's variable" if passphrase is None else "has no passphrase"
        raise UserError(f"the private key in {source} {wants}", where=where,
                        hint="--passphrase-env NAME (registry.signing.passphrase_env) names the variable that holds it"
                        ) from None
    except ValueError:
        damage = pem_damage(pem)
        if damage is not None:  # before blaming the passphrase: a cut or damaged file fails to decrypt too
            raise UserError(f"the private key in {source} {damage}", where=where,
                            hint="copy the whole key again (from -----BEGIN to -----END)") from None
        why = "cannot be decrypted with that passphrase" if passphrase is not None else "is not a PEM private key"
        raise UserError(f"the private key in {source} {why}", where=where,
                        hint="check the passphrase variable" if passphrase is not None
                        else "give an elliptic-curve private key in PEM (openssl ecparam -genkey)") from None
    if not isinstance(private_key, ec.EllipticCurvePrivateKey):
        raise UserError(f"the key in {source} is not an elliptic-curve key", where=where,
                        hint="model-signing signs with P-256, P-384 or P-521 keys: openssl ecparam -name prime256v1 "
                             "-genkey -noout -out KEY.pem")
    return SigningKey(source=source, private_key=private_key)


_PEM_BLOCK = re.compile(r"-----BEGIN ([A-Z0-9 ]+)-----(.*?)(-----END \1-----|\Z)", re.DOTALL)


def pem_damage(pem: bytes) -> str | None:
    """What is wrong with the first PEM block of ``pem`` as a container, whatever key it holds: None where its END
    line is there, its body is base64 and the DER inside is as long as it says."""
    block = _PEM_BLOCK.search(pem.decode(errors="replace"))
    if block is None:
        return None  # no PEM at all: the caller's own message says so
    if not block.group(3):
        return "is cut short (no -----END line)"
    try:
        der = base64.b64decode("".join(block.group(2).split()), validate=True)
    except binascii.Error:
        return "is damaged (its body is not base64)"
    declared = _der_length(der)
    if declared != len(der):
        return f"is cut short or damaged ({len(der)} bytes where its encoding says {declared})"
    return None


def _der_length(der: bytes) -> int | None:
    """The length a DER SEQUENCE says it has, header included."""
    if len(der) < 2 or der[0] != 0x30:
        return None
    if der[1] < 0x80:
        return 2 + der[1]
    count = der[1] & 0x7F
    if len(der) < 2 + count:
        return None
    return 2 + count + int.from_bytes(der[2:2 + count], "big")


class TrustedKey(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    fingerprint: str
    source: str  # the file it was read from
    pem: bytes


class Trust(BaseModel):
    """Whom a pull believes: named public keys, per channel the names whose artefacts may be on it (checked when
    one is promoted there and when one is pulled through it; none listed: any trusted key) and how long a statement
    that the channel points at an artefact stays good, and the keys revoked since a time (what they signed from
    then on is not believed)."""

    keys: list[TrustedKey]
    channel_signers: dict[str, list[str]] = {}
    channel_expiry_s: dict[str, float] = {}
    revoked: dict[str, datetime] = {}  # key name → when it was revoked

    def named(self, key_fingerprint: str) -> TrustedKey | None:
        return next((key for key in self.keys if key.fingerprint == key_fingerprint), None)

    @property
    def names(self) -> str:
        return ", ".join(key.name for key in self.keys)


def load_trust(paths: list[Path], *, where: str = "--trust") -> Trust:
    """The keys in ``paths``: PEM public keys (named by their file's stem), directories of them (``*.pem``,
    ``*.pub``), or YAML trust files (``keys: {name: path}``, ``channels: {channel: [names]}``; paths relative to the
    file). Raises ``UserError`` naming the file for one that cannot be read as a key, a name given twice, or a
    channel naming an unknown key."""
    _require_model_signing()
    keys: list[TrustedKey] = []
    channels: dict[str, list[str]] = {}
    expiry: dict[str, float] = {}
    revoked: dict[str, datetime] = {}
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in (".pem", ".pub"))
            if not found:
                raise UserError(f"{path} holds no public key (*.pem, *.pub)", where=where,
                                hint="point --trust at a public key file, a directory of them, or a trust YAML")
            keys += [_trusted_key(p.stem, p, where) for p in found]
        elif path.suffix in (".yaml", ".yml"):
            read = _read_trust_file(path, where)
            keys += read.keys
            for channel, signers in read.channel_signers.items():
                channels.setdefault(channel, []).extend(signers)
            expiry.update(read.channel_expiry_s)
            revoked.update(read.revoked)
        else:
            keys.append(_trusted_key(path.stem, path, where))
    seen: dict[str, TrustedKey] = {}
    for key in keys:
        if key.name in seen and seen[key.name].fingerprint != key.fingerprint:
            raise UserError(f"two different keys are named {key.name!r} ({seen[key.name].source}, {key.source})",
                            where=where, hint="give each trusted key its own name")
        seen[key.name] = key
    for channel, signers in channels.items():
        unknown = sorted(set(signers) - set(seen))
        if unknown:
            raise UserError(f"channel {channel!r} allows {', '.join(unknown)}, which no trusted key is named",
                            where=where, hint=f"trusted keys: {', '.join(sorted(seen)) or 'none'}")
    unknown_revoked = sorted(set(revoked) - set(seen))
    if unknown_revoked:
        raise UserError(f"revoked: {', '.join(unknown_revoked)} is no trusted key's name", where=where,
                        hint=f"revoke a key by the name keys: gives it ({', '.join(sorted(seen)) or 'none'})")
    return Trust(keys=list(seen.values()), channel_signers=channels, channel_expiry_s=expiry, revoked=revoked)


def _trusted_key(name: str, path: Path, where: str) -> TrustedKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        pem = path.read_bytes()
        public_key = serialization.load_pem_public_key(pem)
    except FileNotFoundError:
        raise UserError(f"no public key at {path}", where=where, hint="give the signer's public key (PEM)") from None
    except ValueError:
        hint = ("that is a private key: trust its public half (openssl ec -in KEY.pem -pubout -out KEY.pub)"
                if b"PRIVATE KEY" in pem else "give a PEM public key (-----BEGIN PUBLIC KEY-----)")
        raise UserError(f"{path} is not a PEM public key", where=where, hint=hint) from None
    if not isinstance(public_key, ec.EllipticCurvePublicKey):
        raise UserError(f"{path} is not an elliptic-curve public key", where=where,
                        hint="model-signing's key signatures use P-256, P-384 or P-521 keys")
    if not is_name(name):
        raise UserError(f"{path.name}: {name!r} cannot name a key (letters, digits, '.', '_', '-')", where=where)
    return TrustedKey(name=name, fingerprint=fingerprint(public_key), source=str(path), pem=pem)


def _read_trust_file(path: Path, where: str) -> Trust:
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError(f"no trust file at {path}", where=where) from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path} is not valid YAML: {exc}", where=where) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("keys"), dict) or not raw["keys"]:
        raise UserError(f"{path} has no keys: mapping", where=f"{where}: {path}",
                        hint="keys: {nightly: keys/nightly.pub}  (and optionally channels: {prod: [nightly]})")
    unknown_fields = sorted(set(raw) - {"keys", "channels", "revoked"})
    if unknown_fields:
        raise UserError(f"unknown field(s) {', '.join(unknown_fields)}", where=f"{path}",
                        hint="a trust file has keys:, channels: and revoked:")
    keys = [_trusted_key(str(name), (path.parent / str(key_path)), f"{path}: keys.{name}")
            for name, key_path in raw["keys"].items()]
    channels_raw = raw.get("channels") or {}
    channel_hint = "channels: {prod: [nightly]}, or {prod: {signers: [nightly], expires: 7d}}"
    if not isinstance(channels_raw, dict):
        raise UserError("channels: must map each channel to its signers", where=f"{path}: channels", hint=channel_hint)
    signers: dict[str, list[str]] = {}
    expiry: dict[str, float] = {}
    for channel, entry in channels_raw.items():
        at = f"{path}: channels.{channel}"
        if isinstance(entry, dict):
            unknown = sorted(set(entry) - {"signers", "expires"})
            if unknown:
                raise UserError(f"unknown field(s) {', '.join(map(str, unknown))}", where=at, hint=channel_hint)
            if "expires" in entry:
                expiry[str(channel)] = statement_validity_s(entry["expires"], f"{at}.expires", "e.g. expires: 7d")
            entry = entry.get("signers")
            if entry is None:
                continue
        if not isinstance(entry, list):
            raise UserError("a channel's signers are a list of key names", where=at, hint=channel_hint)
        signers[str(channel)] = [str(name) for name in entry]
    revoked_raw = raw.get("revoked") or {}
    if not isinstance(revoked_raw, dict):
        raise UserError("revoked: must map key names to when each was revoked", where=f"{path}: revoked",
                        hint="revoked: {old-nightly: 2026-11-30T00:00:00Z}")
    revoked = {str(name): _trust_time(moment, f"{path}: revoked.{name}") for name, moment in revoked_raw.items()}
    return Trust(keys=keys, channel_signers=signers, channel_expiry_s=expiry, revoked=revoked)


def statement_validity_s(value: object, where: str, hint: str) -> float:
    """How long a channel statement stays good, in seconds, from ``7d``, ``12h``, …; raises ``UserError`` naming
    ``where`` for text that is no duration or none at all."""
    from registry.gc import parse_duration

    try:
        seconds = parse_duration(str(value))
    except ValueError as exc:
        raise UserError(str(exc), where=where, hint=hint) from None
    if seconds <= 0:
        raise UserError("a statement must stay good for some time", where=where, hint=hint)
    return seconds


def _trust_time(value: object, where: str) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    try:
        return parse_timestamp(str(value))
    except ValueError:
        raise UserError(f"{value!r} is not a time", where=where,
                        hint="write when the key was revoked, e.g. 2026-11-30T00:00:00Z") from None


def revoked_since(trust: Trust, signer: str, signed_at: datetime | None) -> datetime | None:
    """When ``signer`` was revoked, if what it signed at ``signed_at`` (None: at an unknown time) is therefore not
    believed."""
    revoked_at = trust.revoked.get(signer)
    if revoked_at is None or (signed_at is not None and signed_at < revoked_at):
        return None
    return revoked_at


# --- signing and checking -----------------------------------------------------------------------------------------


def sign_manifest(manifest: Manifest, key: SigningKey) -> bytes:
    """A model-signing bundle (JSON bytes) over the pulled directory of ``manifest``: its files, ``artefact.json``
    and its publication record."""
    _require_model_signing()
    from model_signing import manifest as ms_manifest
    from model_signing._hashing.hashing import Digest
    from model_signing._signing import sign_ec_key, sign_sigstore_pb, signing

    serialization = ms_manifest.SerializationType.from_args(
        {"method": "files", "hash_type": "sha256", "allow_symlinks": False, "ignore_paths": list(UNSIGNED_PATHS)})
    items = [serialization.new_item(path, Digest("sha256", bytes.fromhex(digest)))
             for path, digest in sorted(signed_digests(manifest, SIGNED_AT_PUBLISH).items())]
    payload = signing.Payload(ms_manifest.Manifest(manifest.model, items, serialization))

    class _LoadedKeySigner(sign_ec_key.Signer):  # upstream's signer, with the key we loaded (it reads only files)
        def __init__(self, private_key: Any) -> None:
            self._private_key = private_key

    bundle = _LoadedKeySigner(key.private_key).sign(payload)
    assert isinstance(bundle, sign_sigstore_pb.Signature)
    return bundle.bundle.to_json().encode()


@dataclass(frozen=True)
class SignedContent:
    """What a bundle says, read without checking who signed it."""

    key_hint: str  # the signer's key fingerprint the bundle names ("" in bundles from before model-signing 1.0)
    digests: dict[str, str]  # path → sha256
    ignored: list[str]


def read_bundle(body: bytes, where: str) -> tuple[Any, SignedContent]:
    """Parse a bundle's JSON and its statement; raises ``SignatureError`` for a damaged or foreign one."""
    _require_model_signing()
    from model_signing._signing import sign_sigstore_pb
    from model_signing._signing.signing import dsse_payload_to_manifest

    with tempfile.TemporaryDirectory(prefix="enginesmith-signature-") as scratch:
        copy = Path(scratch) / "bundle.sig"
        copy.write_bytes(body)
        try:
            signature = sign_sigstore_pb.Signature.read(copy)
            envelope = signature.bundle.dsse_envelope
            if envelope is None:
                raise ValueError("no DSSE envelope")
            statement = json.loads(envelope.payload)  # bytes: the JSON reader decoded the base64
            signed = dsse_payload_to_manifest(statement)
        except Exception as exc:  # a garbled bundle fails anywhere in JSON, protobuf, base64 or the statement
            raise SignatureError(f"the signature bundle is damaged or not a model-signing bundle "
                                 f"({type(exc).__name__}: {str(exc)[:200]})", where=where,
                                 hint="re-sign the artefact and publish it again") from None
    serialization = signed.serialization_type
    if serialization.get("method") != "files" or serialization.get("hash_type") != "sha256":
        raise SignatureError(f"the signature hashes {serialization.get('method')} with "
                             f"{serialization.get('hash_type')}; enginesmith checks per-file sha256 signatures",
                             where=where, hint="sign with model-signing's default serialization (files, sha256)")
    digests = {rd.identifier: rd.digest.digest_hex for rd in signed.resource_descriptors()}
    material = signature.bundle.verification_material
    hint = (material.public_key.hint if material is not None and material.public_key is not None else None) or ""
    return signature, SignedContent(key_hint=hint, digests=digests, ignored=list(serialization.get("ignore_paths", [])))


class SignatureCheck(BaseModel):
    """A signature that held: who signed (a trusted key's name) and what it covers."""

    signer: str
    fingerprint: str
    covers: Covers


def read_signature(store: RegistryStore, manifest: Manifest) -> bytes | None:
    """The bytes of the manifest's signature bundle (``None`` for an unsigned manifest). Raises ``SignatureError``
    for one that is missing or does not match the manifest's size and sha256."""
    import contextlib

    reference = manifest.signature
    if reference is None:
        return None
    where = f"{store.location}: {manifest.ref}"
    if reference.size > MAX_SIGNATURE_BYTES:
        raise SignatureError(f"its signature is {reference.size} bytes, too large for a bundle", where=where,
                             hint="the manifest is damaged; publish the artefact again")
    body = b""
    try:
        with contextlib.closing(store.read_blob(reference.sha256)) as chunks:
            for chunk in chunks:  # no further than one byte past the size the manifest gives: a registry may lie
                body += chunk
                if len(body) > reference.size:
                    break
    except NotFoundError:
        raise SignatureError(f"its signature blob {reference.sha256[:12]} is not in the registry", where=where,
                             hint="publish the artefact again") from None
    if len(body) != reference.size or hashlib.sha256(body).hexdigest() != reference.sha256:
        raise SignatureError(f"its signature blob {reference.sha256[:12]} does not match its sha256", where=where,
                             hint="the registry is damaged; publish the artefact again")
    return body


def verify_stored(store: RegistryStore, manifest: Manifest, trust: Trust) -> SignatureCheck:
    """``check_signature`` of the manifest's stored signature."""
    return check_signature(manifest, read_signature(store, manifest), trust, where=store.location)


def authorize_channel(store: RegistryStore, manifest: Manifest, channel: str, trust: Trust) -> SignatureCheck:
    """That ``manifest`` may be moved onto ``channel``: its signature holds, and where the trust list names who may
    move this channel, its signer is one of them. Raises ``SignatureError`` otherwise."""
    checked = verify_stored(store, manifest, trust)
    require_channel_signer(checked, manifest, channel, trust, where=f"{store.location}: {manifest.model}:{channel}",
                           hint="promote an artefact signed by an allowed key; the channel was not moved")
    return checked


def require_channel_signer(checked: SignatureCheck, manifest: Manifest, channel: str, trust: Trust, *, where: str,
                           hint: str) -> None:
    """Raises ``SignatureError`` where the trust list names who may put artefacts on ``channel`` and ``checked``'s
    signer is not one of them (a channel it names no one for is open to every trusted key)."""
    allowed = trust.channel_signers.get(channel)
    if allowed is not None and checked.signer not in allowed:
        raise SignatureError(f"{manifest.ref} is signed by {checked.signer}, and only {', '.join(allowed)} may put "
                             f"artefacts on channel {channel!r}", where=where, hint=hint)


def check_signature(manifest: Manifest, body: bytes | None, trust: Trust, *, where: str) -> SignatureCheck:
    """That ``body`` (the manifest's signature blob, as ``read_signature`` read it) is a valid signature by a trusted
    key over exactly what pulling ``manifest`` lays out. Raises ``SignatureError`` with the reason otherwise."""
    ref = manifest.signature
    if ref is None or body is None:
        raise SignatureError(f"{manifest.ref} is not signed, and a trust list is set", where=where,
                             hint="publish it with a signing key (enginesmith publish --sign-key), or pull "
                                  "without --trust")
    signature, content = read_bundle(body, where)
    candidates = [k for k in trust.keys if k.fingerprint == content.key_hint] if content.key_hint else trust.keys
    if not candidates:
        raise SignatureError(f"{manifest.ref} is signed by key {content.key_hint[:16]}…, which is not trusted "
                             f"(trusted: {trust.names})", where=where,
                             hint="add the signer's public key to --trust if you trust it")
    checked, verified = None, None
    for key in candidates:
        try:
            verified = _verifier(key).verify(signature)  # model-signing's check: the key, the envelope, the statement
        except Exception:
            continue
        checked = key
        break
    if checked is None or verified is None:
        raise SignatureError(f"the signature of {manifest.ref} does not verify with key {candidates[0].name} "
                             "(its statement was changed after signing, or it was signed by another key)",
                             where=where, hint="do not use this artefact; publish it again from a trusted build")
    if manifest.model != manifest.artefact.lineage.model_id:  # the name it is stored under is not in every signature
        raise SignatureError(f"{manifest.ref} is stored as model {manifest.model!r}, and its signed artefact is of "
                             f"{manifest.artefact.lineage.model_id!r}", where=where,
                             hint="the manifest was copied under another model's name; do not use this artefact")
    signed = {rd.identifier: rd.digest.digest_hex for rd in verified.resource_descriptors()}
    problem = digest_mismatch(signed, signed_digests(manifest, ref.covers))
    if problem:
        raise SignatureError(f"the signature of {manifest.ref} is over other content: {problem}", where=where,
                             hint="the manifest or its signature was swapped; do not use this artefact")
    # Only a dated signature says when it was made (the publication time it covers); another is as late as can be.
    revoked_at = revoked_since(trust, checked.name, manifest.published_at if ref.covers == "publication-dated"
                               else None)
    if revoked_at is not None:
        when = "" if ref.covers == "publication-dated" else " (its signature does not say when it was made)"
        raise SignatureError(f"{manifest.ref} is signed by {checked.name}, revoked "
                             f"{revoked_at.isoformat(timespec='seconds')}, at {manifest.published}{when}",
                             where=where, hint="do not use this artefact; publish it again signed by a current key")
    return SignatureCheck(signer=checked.name, fingerprint=checked.fingerprint, covers=ref.covers)


def digest_mismatch(signed: Mapping[str, str], expected: Mapping[str, str]) -> str | None:
    """How a signature's file list differs from what it should list (the first few differences), or ``None``."""
    problems = [f"{path} is not signed" for path in sorted(set(expected) - set(signed))]
    problems += [f"{path} is signed but not in the artefact" for path in sorted(set(signed) - set(expected))]
    problems += [f"{path} differs" for path in sorted(set(signed) & set(expected)) if signed[path] != expected[path]]
    if not problems:
        return None
    return "; ".join(problems[:4]) + (f"; and {len(problems) - 4} more" if len(problems) > 4 else "")


def adopt_signature(body: bytes, manifest: Manifest, *, where: str) -> SignatureRef:
    """A signature made by model-signing's CLI over an artefact directory before it was published: kept if it lists
    exactly the artefact's files and ``artefact.json`` (as ``pull`` lays them out). Who signed it is checked at pull
    time, against the puller's trust list."""
    if len(body) > MAX_SIGNATURE_BYTES:
        raise SignatureError(f"{len(body)} bytes is too large for a signature bundle", where=where)
    _, content = read_bundle(body, where)
    problem = digest_mismatch(content.digests, signed_digests(manifest, "artefact"))
    if problem:
        raise SignatureError(f"the signature is not over this artefact directory: {problem}", where=where,
                             hint="sign the directory as built (artefact.json as enginesmith wrote it), with "
                                  "model_signing sign key DIR --signature DIR/model.sig")
    return SignatureRef(sha256=hashlib.sha256(body).hexdigest(), size=len(body), signer=content.key_hint,
                        covers="artefact")


def _verifier(key: TrustedKey) -> Any:
    from cryptography.hazmat.primitives import serialization
    from model_signing._signing import sign_ec_key

    class _LoadedKeyVerifier(sign_ec_key.Verifier):  # upstream's verifier, with the key we loaded
        def __init__(self, public_key: Any) -> None:
            self._public_key = public_key

    return _LoadedKeyVerifier(serialization.load_pem_public_key(key.pem))


def _require_model_signing() -> None:
    try:
        import model_signing  # noqa: F401
    except ImportError:
        raise UserError("signing and verifying need model-signing, which is not installed", hint=_INSTALL_HINT
                        ) from None


def signature_covers_text(covers: Covers) -> str:
    return {"publication-dated": "the files, artefact.json and the publication record (key, validation report, "
                                 "publication time)",
            "publication": "the files, artefact.json and the publication record (key, validation report; signed "
                           "before the publication time was)",
            "artefact": "the files and artefact.json (signed before publishing; the validation report is not "
                        "signed)"}[covers]

