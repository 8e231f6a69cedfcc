"""The pull stage: a Hub repo at a revision (resolved to its commit sha first) or a local directory, to a
``Checkpoint`` on local disk holding only what a build needs.

Hub access goes through huggingface_hub itself, so ``HF_HUB_OFFLINE=1``, ``HF_HOME``/``HF_HUB_CACHE`` and
``HF_ENDPOINT`` behave as users of the Hub expect. The token comes from ``HF_TOKEN`` (or a Prefect Secret in
flows) and is registered for scrubbing before any request is made.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from enginesmith.core.checkpoints.digest import directory_digest, file_sha256
from enginesmith.core.checkpoints.files import needed_files, refuse_remote_code
from enginesmith.core.checkpoints.inspect import describe, read_config
from enginesmith.core.checkpoints.models import Checkpoint, CheckpointFile
from enginesmith.core.diskspace import require_free_space
from enginesmith.core.errors import TransientError, UserError
from enginesmith.core.secrets import hf_token, scrub
from enginesmith.core.specs import check_revision

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
# What "the Hub did not answer" raises, per HTTP client: huggingface_hub speaks through requests before 1.0, httpx
# in 1.x and httpx2 from 2.0 (a node installs whichever its vLLM needs).
_NO_ANSWER_ERRORS = (("requests", ("ConnectionError", "Timeout")),
                     ("httpx", ("NetworkError", "TimeoutException", "RemoteProtocolError")),
                     ("httpx2", ("NetworkError", "TimeoutException", "RemoteProtocolError")))
# Room left over after the download, so the quantisation that follows has somewhere to write.
GIB = 1024**3
DISK_HEADROOM_BYTES = 1 * GIB


def parse_source(reference: str) -> tuple[str, str]:
    """``org/name@rev`` → (``org/name``, ``rev``); no ``@`` → revision ``main``. Paths are returned whole."""
    if Path(reference).expanduser().exists() or "@" not in reference:
        return reference, "main"
    repo, _, revision = reference.rpartition("@")
    return repo, revision


def pull_checkpoint(
    source: str,
    revision: str = "main",
    *,
    dest: Path | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
) -> Checkpoint:
    """Resolve and fetch a checkpoint; a local directory is inspected in place."""
    local = Path(source.removeprefix("file://")).expanduser()
    if source.startswith(("/", "./", "../", "~", "file:")) or local.is_dir():
        return local_checkpoint(local, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    check_revision(revision)
    return _hub_checkpoint(source, revision, dest=dest, allow_pickle=allow_pickle,
                           trust_remote_code=trust_remote_code)


def resolve_revision(source: str, revision: str = "main") -> str:
    """What a source is at now, without downloading it: a Hub revision's commit sha (offline: from the cache),
    or a local directory's content digest. This is what planning keys use."""
    local = Path(source.removeprefix("file://")).expanduser()
    if source.startswith(("/", "./", "../", "~", "file:")) or local.is_dir():
        return local_checkpoint(local).commit_sha
    check_revision(revision)
    from huggingface_hub import HfApi, constants

    token = hf_token()
    try:
        if constants.HF_HUB_OFFLINE:
            return cached_snapshot(source, revision).name
        sha = HfApi(token=token).model_info(source, revision=revision).sha
        assert sha is not None
        return sha
    except Exception as exc:
        raise hub_error(exc, source, revision) from None


def cached_revision(source: str, revision: str = "main") -> str | None:
    """A Hub revision's commit sha as the local Hub cache records it (what an offline resolution reads), without the
    network whatever ``HF_HUB_OFFLINE`` says; None where the cache holds no snapshot of it."""
    try:
        return cached_snapshot(source, check_revision(revision)).name
    except Exception:  # not cached, or not a repo id: the caller keys the branch by its name and says so
        return None


def cached_snapshot(repo_id: str, revision: str) -> Path:
    """The local Hub cache's snapshot directory of ``repo_id`` at ``revision`` (huggingface_hub's own lookup: the
    branch's ref, then the commit's folder); raises huggingface_hub's error where it has none."""
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, revision=revision, local_files_only=True, token=hf_token()))


def local_checkpoint(path: Path, *, allow_pickle: bool = False, trust_remote_code: bool = False) -> Checkpoint:
    if not path.is_dir():
        raise UserError("local checkpoint directory not found", where=str(path), hint="check the path")
    where = str(path)
    repo_files = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_file())
    names = needed_files(repo_files, where=where, allow_pickle=allow_pickle, read_json=_json_in(path))
    refuse_remote_code(read_config(path), repo_files, where=where, trust_remote_code=trust_remote_code)
    files = [CheckpointFile(path=n, size=(path / n).stat().st_size, sha256=file_sha256(path / n)) for n in names]
    check_recorded_digests(path, {f.path: f.sha256 for f in files if f.sha256})
    return Checkpoint(
        source="local", repo_id=str(path.resolve()), requested_revision="-",
        commit_sha=directory_digest(path, names), local_path=str(path.resolve()), files=files,
        total_bytes=sum(f.size for f in files), **describe(path, names),
    )


def check_recorded_digests(path: Path, known: dict[str, str] | None = None) -> None:
    """Refuse a directory whose ``provenance.json`` records file digests (``"files": {name: sha256}``, as the
    architecture stand-ins' do) where a file is missing or differs: what the provenance describes is no longer
    what is there. ``known`` holds digests already computed."""
    provenance_path = path / "provenance.json"
    if not provenance_path.is_file():
        return
    try:
        recorded = json.loads(provenance_path.read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        raise UserError("provenance.json is not a JSON object", where=str(provenance_path),
                        hint="restore it, or remove it if the directory has no provenance") from None
    if not isinstance(recorded, dict):
        return
    for name, expected in sorted(recorded.items()):
        file_path = path / name
        if not file_path.is_file():
            raise UserError(f"{name} is missing: provenance.json records it", where=str(file_path),
                            hint="restore the directory as it was made (git checkout, or the script its "
                                 "provenance names)")
        actual = (known or {}).get(name) or file_sha256(file_path)
        if actual != expected:
            raise UserError(f"{name} was modified after provenance.json was written (sha256 {actual[:12]}, "
                            f"recorded {str(expected)[:12]})", where=str(file_path),
                            hint="restore the directory as it was made (git checkout, or the script its "
                                 "provenance names); a changed model is a new model with a provenance of its own")


def _json_in(directory: Path) -> Callable[[str], Any]:
    return lambda name: json.loads((directory / name).read_text())


def _hub_checkpoint(repo_id: str, revision: str, *, dest: Path | None, allow_pickle: bool,
                    trust_remote_code: bool) -> Checkpoint:
    from huggingface_hub import constants

    token = hf_token()
    try:
        if constants.HF_HUB_OFFLINE:
            return _from_cache(repo_id, revision, dest, allow_pickle, trust_remote_code)
        return _download(repo_id, revision, token, dest, allow_pickle, trust_remote_code)
    except UserError:
        raise
    except Exception as exc:  # huggingface_hub and requests errors: turn them into a scrubbed user error
        raise hub_error(exc, repo_id, revision) from None


def _download(repo_id: str, revision: str, token: str | None, dest: Path | None, allow_pickle: bool,
              trust_remote_code: bool) -> Checkpoint:
    from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download

    where = f"{repo_id}@{revision}"
    info = HfApi(token=token).model_info(repo_id, revision=revision, files_metadata=True)
    commit_sha = info.sha
    assert commit_sha is not None
    siblings = {s.rfilename: s for s in info.siblings or []}
    names = needed_files(siblings, where=where, allow_pickle=allow_pickle, read_json=lambda name: json.loads(
        Path(hf_hub_download(repo_id, name, revision=commit_sha, token=token)).read_text()))
    config_path = Path(hf_hub_download(repo_id, "config.json", revision=commit_sha, token=token))
    refuse_remote_code(read_config(config_path.parent), siblings, where=where, trust_remote_code=trust_remote_code)

    files = [CheckpointFile(path=n, size=_size(siblings[n]), sha256=_lfs_sha256(siblings[n])) for n in names]
    target_dir = dest or Path(constants.HF_HUB_CACHE)
    require_free_space(target_dir, sum(f.size for f in files), what=f"downloading {where}", where=where,
                       hint="free some space, or point HF_HUB_CACHE (or --dest) at a larger disk",
                       headroom_bytes=DISK_HEADROOM_BYTES)
    snapshot = Path(snapshot_download(repo_id, revision=commit_sha, allow_patterns=names, token=token,
                                      local_dir=dest))
    return Checkpoint(
        source="hub", repo_id=repo_id, requested_revision=revision, commit_sha=commit_sha,
        local_path=str(snapshot), files=files, total_bytes=sum(f.size for f in files), **describe(snapshot, names),
    )


def _from_cache(repo_id: str, revision: str, dest: Path | None, allow_pickle: bool,
                trust_remote_code: bool) -> Checkpoint:
    where = f"{repo_id}@{revision}"
    snapshot = cached_snapshot(repo_id, revision)
    repo_files = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
    names = needed_files(repo_files, where=where, allow_pickle=allow_pickle, read_json=_json_in(snapshot))
    refuse_remote_code(read_config(snapshot), repo_files, where=where, trust_remote_code=trust_remote_code)
    files = [CheckpointFile(path=n, size=(snapshot / n).stat().st_size, sha256=_cached_sha256(snapshot / n))
             for n in names]
    local_path = snapshot
    if dest is not None:
        local_path = dest
        dest.mkdir(parents=True, exist_ok=True)
        for name in names:
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(snapshot / name, dest / name)
    return Checkpoint(
        source="hub", repo_id=repo_id, requested_revision=revision, commit_sha=snapshot.name,
        local_path=str(local_path), files=files, total_bytes=sum(f.size for f in files),
        **describe(snapshot, names),
    )


def _size(sibling: object) -> int:
    size = getattr(sibling, "size", None)
    lfs = getattr(sibling, "lfs", None)
    return int(size if size is not None else (lfs.size if lfs else 0))


def _lfs_sha256(sibling: object) -> str | None:
    lfs = getattr(sibling, "lfs", None)
    return getattr(lfs, "sha256", None)


def _cached_sha256(path: Path) -> str | None:
    """In the Hub cache an LFS file's blob is named by its sha256 (other blobs by their git sha1)."""
    blob_name = path.resolve().name
    return blob_name if _SHA256.match(blob_name) else None


def hub_error(exc: Exception, repo_id: str, revision: str) -> UserError:
    """What a huggingface_hub failure means for the user: a repo, revision or access problem (deterministic), or
    the Hub or the network not answering (a ``TransientError``: the flows retry it with backoff)."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_id}@{revision}"
    detail = scrub(str(exc)).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, GatedRepoError):
        return UserError(f"repository {repo_id!r} is gated and this token has no access", where=where,
                         hint="accept the licence on the model page and set HF_TOKEN to a token with access")
    if isinstance(exc, RepositoryNotFoundError):
        return UserError(f"repository {repo_id!r} not found", where=where,
                         hint="check the repo id; a private or gated repo needs HF_TOKEN")
    if isinstance(exc, RevisionNotFoundError):
        return UserError(f"revision {revision!r} not found in repository {repo_id!r}", where=where,
                         hint="check the branch or tag name, or pass a commit sha")
    if isinstance(exc, LocalEntryNotFoundError) and constants.HF_HUB_OFFLINE:
        return UserError(f"{repo_id}@{revision} is not in the local Hugging Face cache (offline mode)", where=where,
                         hint="pull it once with network access, or unset HF_HUB_OFFLINE")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    # Online, LocalEntryNotFoundError is huggingface_hub's word for "could not connect and not cached".
    if isinstance(exc, (*_no_answer_errors(), LocalEntryNotFoundError)) or (
            isinstance(status, int) and (status >= 500 or status == 429)):
        return TransientError(f"the Hub did not answer for {repo_id}@{revision}: {detail}", where=where,
                              hint="a network or Hub outage (HF_ENDPOINT): the flows retry it with backoff; a "
                                   "re-run resumes what was downloaded")
    return UserError(f"cannot fetch {repo_id}@{revision}: {detail}", where=where,
                     hint="check the repo id, the revision and HF_TOKEN")


def _no_answer_errors() -> tuple[type[Exception], ...]:
    """The connection, timeout and cut-off errors of each HTTP client installed here."""
    errors: list[type[Exception]] = []
    for module_name, names in _NO_ANSWER_ERRORS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        errors += [getattr(module, name) for name in names]
    return tuple(errors)
