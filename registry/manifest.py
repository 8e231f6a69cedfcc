"""The manifest: what the registry knows about one published artefact (schema version 1).

A manifest is the artefact's own record (``artefact.json``: lineage, kind, target, tp/pp, versions, build
GPU and config, every file with size and sha256) plus what publishing adds: the model id, the registry key,
the validation report and the publication time. It is immutable once written.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from enginesmith.core.artefacts import ARTEFACT_FILE, Artefact
from enginesmith.core.checkpoints.models import CheckpointFile
from enginesmith.core.reports import Objective, parse_report
from enginesmith.core.reports.measures import Spread
from registry.errors import IntegrityError, UnsafePathError
from registry.names import is_digest, is_name

# 2: published_by; 3: a signature (an unsigned manifest is still written as 2, so older readers keep reading it).
# Schema 1 and 2 manifests read as they are.
MANIFEST_SCHEMA_VERSION: Literal[3] = 3
UNSIGNED_SCHEMA_VERSION: Literal[2] = 2
# Written next to the files of a pulled artefact: which manifest they came from (changes with every pull).
PULL_RECORD_FILE = ".enginesmith-pull.json"
# Also laid out by pull: what publishing added (key, validation report), and the signature over the directory.
PUBLICATION_FILE = ".enginesmith-publication.json"
SIGNATURE_FILE = ".enginesmith-model.sig"
RESERVED_TOP_LEVEL_NAMES = frozenset({ARTEFACT_FILE, PULL_RECORD_FILE, PUBLICATION_FILE, SIGNATURE_FILE})
_MAX_PATH_BYTES = 1024
_MAX_COMPONENT_BYTES = 255
_DRIVE = re.compile(r"^[A-Za-z]:")



def unsafe_path_reason(path: str) -> str | None:
    """Why ``path`` may not name a file inside an artefact directory, or ``None`` if it may.

    A safe path is relative, ``/``-separated, and has no empty, ``.`` or ``..`` component: joined to any
    directory it stays inside that directory.
    """
    if not path:
        return "is empty"
    if "\x00" in path:
        return "contains a NUL byte"
    if "\\" in path:
        return "contains a backslash (paths in a manifest use '/')"
    if path.startswith("/") or _DRIVE.match(path):
        return "is absolute"
    parts = path.split("/")
    if ".." in parts:
        return "has a '..' component, which escapes the directory"
    if any(part in ("", ".") for part in parts):
        return "has an empty or '.' component"
    if len(path.encode()) > _MAX_PATH_BYTES or any(len(p.encode()) > _MAX_COMPONENT_BYTES for p in parts):
        return "is too long"
    return None


@dataclass(frozen=True)
class FileListProblem:
    index: int
    message: str
    escapes: bool  # True: the path could land outside the directory; False: the entry is merely invalid


def _folded(path: str) -> str:
    return unicodedata.normalize("NFC", path).casefold()


def file_list_problem(files: Iterable[CheckpointFile]) -> FileListProblem | None:
    """The first file entry that cannot be laid out safely and exactly; ``None`` if all can."""
    # Compared as a case-insensitive, Unicode-normalising filesystem (macOS, Windows) names them: "A.bin" and
    # "a.bin" are one file there, and one would overwrite the other.
    seen: dict[str, str] = {}  # folded path → as listed
    directories: set[str] = set()  # folded
    reserved = {_folded(name) for name in RESERVED_TOP_LEVEL_NAMES}
    for index, entry in enumerate(files):
        reason = unsafe_path_reason(entry.path)
        if reason:
            return FileListProblem(index, f"path {entry.path!r} {reason}", escapes=True)
        folded = _folded(entry.path)
        conflict = None
        if folded in reserved:
            conflict = "is reserved for enginesmith's own record"
        elif seen.get(folded) == entry.path:
            conflict = "is listed twice"
        elif folded in seen:
            conflict = (f"names the same file as {seen[folded]!r} where file names ignore case or Unicode form "
                        "(macOS, Windows)")
        elif folded in directories:
            conflict = "is also a directory of another file"
        parents = folded.split("/")[:-1]
        for depth in range(1, len(parents) + 1):
            parent = "/".join(parents[:depth])
            if parent in seen and conflict is None:
                conflict = f"lies under {seen[parent]!r}, which is a file"
            directories.add(parent)
        if conflict:
            # Two entries for one place: one would overwrite or redirect the other.
            return FileListProblem(index, f"path {entry.path!r} {conflict}", escapes=True)
        seen[folded] = entry.path
        if entry.sha256 is None or not is_digest(entry.sha256):
            return FileListProblem(index, f"file {entry.path!r} needs a sha256 of 64 lower-case hex digits",
                                   escapes=False)
        if entry.size < 0:
            return FileListProblem(index, f"file {entry.path!r} has a negative size", escapes=False)
    return None


class SignatureRef(BaseModel):
    """A manifest's signature: an OpenSSF model-signing bundle stored as a blob (``registry.signing``)."""

    model_config = ConfigDict(extra="forbid")

    sha256: str
    size: int
    signer: str  # the signing key's fingerprint as the bundle names it (sha256 of its public PEM); "" if it names none
    # publication-dated: the files, artefact.json and the publication record with its time (signed by publish);
    # publication: the same without the time (publish before it signed the time); artefact: the files and
    # artefact.json (a directory signed with model-signing's CLI before it was published)
    covers: Literal["publication-dated", "publication", "artefact"]

    @field_validator("sha256")
    @classmethod
    def _digest(cls, value: str) -> str:
        if not is_digest(value):
            raise ValueError("needs a sha256 of 64 lower-case hex digits")
        return value


class Manifest(BaseModel):
    """One published artefact. Stored at ``manifests/<model>/<key>.json``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1, 2, 3] = UNSIGNED_SCHEMA_VERSION
    model: str
    key: str
    published: str  # ISO 8601, UTC
    published_by: str | None = None  # the enginesmith version that published it (None: schema 1)
    artefact: Artefact
    # The validation report (its model belongs to validation/); the resolver reads one number from it.
    validation: dict[str, Any] | None = None
    signature: SignatureRef | None = None  # schema 3

    @field_validator("model", "key")
    @classmethod
    def _safe_name(cls, value: str) -> str:
        if not is_name(value):
            raise ValueError(f"{value!r} is not a safe name (letters, digits, '.', '_', '-')")
        return value

    @field_validator("artefact")
    @classmethod
    def _safe_files(cls, artefact: Artefact) -> Artefact:
        problem = file_list_problem(artefact.files)
        if problem:
            raise PydanticCustomError("unsafe_file" if problem.escapes else "invalid_file", "files[{index}]: {message}",
                                      {"index": problem.index, "message": problem.message})
        return artefact

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.key}"

    @property
    def recipe(self) -> str:
        return self.artefact.lineage.recipe

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.artefact.files)

    @property
    def published_at(self) -> datetime:
        return parse_timestamp(self.published)

    @property
    def cell(self) -> tuple[str, str, str, str, int, int]:
        """What a rebuild replaces: the same model, recipe, kind, target and parallelism."""
        a = self.artefact
        return (self.model, self.recipe, a.kind, a.target, a.tp, a.pp)

    def files_by_digest(self) -> dict[str, list[CheckpointFile]]:
        """Every distinct blob of this manifest and the files that hold it (identical files share a blob)."""
        return files_by_digest(self.artefact.files)  # the validator refuses manifests without a sha256

    def blob_digests(self) -> set[str]:
        """Every blob this manifest keeps alive: its files' and its signature's."""
        return set(self.files_by_digest()) | ({self.signature.sha256} if self.signature else set())

    def with_signature(self, signature: SignatureRef) -> Manifest:
        return self.model_copy(update={"signature": signature, "schema_version": MANIFEST_SCHEMA_VERSION})

    def to_bytes(self) -> bytes:
        return (self.model_dump_json(indent=2, exclude_none=False) + "\n").encode()


_COVERS_LABEL = {"publication-dated": "publication and its time", "publication": "publication",
                 "artefact": "artefact"}

def signer_label(manifest: Manifest) -> str:
    """Who signed an artefact by its manifest's word, as the catalogue and ``show`` print it: the key's fingerprint
    (which a trust list names) and what it covers, or ``unsigned``. Whoever can write the registry can write this
    field: only a check against trusted keys (``--trust``) says the signature holds."""
    signature = manifest.signature
    if signature is None:
        return "unsigned"
    covers = _COVERS_LABEL[signature.covers]
    return f"key {signature.signer[:16] or '(not named in the bundle)'} (over the {covers}; not checked)"


def key_problem(key: str, artefact: Artefact, validation: Mapping[str, Any] | None, *,
                stored: bool = False) -> str | None:
    """Why ``key`` cannot be this manifest's: a manifest is stored under its artefact's own key, or under the key of
    the validation that passed it (which names that artefact). None when it can. A ``stored`` manifest whose
    report predates reports naming their artefact is read as before (there is nothing to check it against)."""
    if stored and validation is not None and "artefact_key" not in validation:
        return None
    validated = (validation or {}).get("artefact_key")
    if validated is not None and validated != artefact.key:
        return f"its validation report is of artefact {str(validated)[:12]}, but it holds artefact {artefact.key[:12]}"
    allowed = [artefact.key] + ([str(validation["key"])] if validation and validation.get("key") else [])
    if key not in allowed:
        return (f"key {key[:12]} is neither its artefact's ({artefact.key[:12]})"
                + (f" nor its validation's ({allowed[1][:12]})" if len(allowed) > 1 else ""))
    return None


def utc_timestamp(moment: datetime | None = None) -> str:
    return (moment or datetime.now(timezone.utc)).astimezone(timezone.utc).isoformat()


# A publication time further ahead than clocks disagree is not believed: set by hand, it would hold `latest`, the
# resolver's tie-break and gc's "newest" against every genuine publish.
CLOCK_SKEW = timedelta(minutes=5)


def believable_time(text: str, now: datetime | None = None) -> datetime:
    """A stored publication time as ordering may use it: the time itself, or the epoch for one in the future."""
    moment = parse_timestamp(text)
    if moment > (now or datetime.now(timezone.utc)) + CLOCK_SKEW:
        return datetime.fromtimestamp(0, timezone.utc)
    return moment


def parse_timestamp(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def display_timestamp(text: str) -> str:
    """A stored time as tables and pages show it: ``YYYY-MM-DD HH:MM:SS`` in UTC; the text itself when it is not a
    timestamp, ``—`` when it is empty."""
    if not text:
        return "—"
    try:
        moment = parse_timestamp(text)
    except ValueError:
        return text
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def parse_manifest(body: bytes, where: str) -> Manifest:
    """Parse and check a stored manifest.

    Raises ``UnsafePathError`` for a file path that would escape the artefact directory and
    ``IntegrityError`` for anything else that is not a valid manifest; both name ``where`` and the field.
    """
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IntegrityError(f"not valid JSON ({exc})", where=where,
                             hint="the manifest is damaged; re-publish the artefact under a new key") from None
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if isinstance(version, int) and version > MANIFEST_SCHEMA_VERSION:
        from enginesmith import __version__

        publisher = raw.get("published_by")
        by = f"enginesmith {publisher}" if isinstance(publisher, str) else "a newer enginesmith"
        raise IntegrityError(
            f"manifest schema {version}, published by {by}, is newer than enginesmith {__version__} reads "
            f"(schema {MANIFEST_SCHEMA_VERSION} at most); nothing was written",
            where=where, hint=f"upgrade enginesmith: pip install --upgrade 'enginesmith>={publisher}'"
            if isinstance(publisher, str) else "upgrade enginesmith: pip install --upgrade enginesmith",
        )
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        if first["type"] == "unsafe_file":
            raise UnsafePathError(
                f"{field}.{first['msg']}", where=where,
                hint="refused: this manifest could write outside the destination; do not pull it",
            ) from None
        if first["type"] == "invalid_file":
            raise IntegrityError(f"{field}.{first['msg']}", where=where,
                                 hint="the manifest is damaged; re-publish the artefact") from None
        raise IntegrityError(f"{field}: {first['msg']}", where=where,
                             hint="the manifest does not match schema 1; re-publish the artefact") from None


class SpeedEvidence(BaseModel):
    """What a manifest's validation says about the artefact for ranking it: the objective per round, whether its
    speed only checked the harness (the cpu target: the same kernels on both sides), and the mean of its accuracy
    measures."""

    objective: Spread | None
    checks_harness: bool
    accuracy: float | None


def speed_evidence(validation: Mapping[str, Any] | None, objective: Objective) -> SpeedEvidence | None:
    """``None`` when there is no report this version can read."""
    parsed = parse_report(validation)
    if parsed is None or isinstance(parsed, str):
        return None
    scores = list(parsed.accuracy().values())
    return SpeedEvidence(objective=parsed.objective_spread(objective), checks_harness=parsed.speed_checks_harness(),
                         accuracy=sum(scores) / len(scores) if scores else None)


def validation_metric(validation: Mapping[str, Any] | None, objective: Objective) -> float | None:
    """The number the resolver ranks artefacts by, as the report's kind defines it (``KindReport.objective_spread``'s
    median:
    an LLM's max output tokens/s or median TPOT at concurrency 1; an encoder's embeddings/s at its largest batch or
    median latency at its smallest); ``None`` when there is no report this version can read."""
    evidence = speed_evidence(validation, objective)
    return evidence.objective.median if evidence is not None and evidence.objective is not None else None


def higher_is_better(objective: Objective) -> bool:
    return objective == "throughput"


def files_by_digest(files: list[CheckpointFile]) -> dict[str, list[CheckpointFile]]:
    """Each distinct sha256 among ``files`` (which must all carry one) and the files that hold it."""
    by_digest: dict[str, list[CheckpointFile]] = {}
    for entry in files:
        assert entry.sha256 is not None
        by_digest.setdefault(entry.sha256, []).append(entry)
    return by_digest
