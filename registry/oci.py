"""A registry inside an OCI distribution registry (CNCF distribution, Harbor, ECR, GHCR, Artifactory):
``oci://host[:port]/namespace`` (HTTPS) or ``oci+http://host:port/namespace`` (plain HTTP, for loopback and labs).

Repositories under the namespace:
- ``<ns>/blobs``: every blob, content-addressed: the store's one blob space (OCI scopes blobs to repositories).
- ``<ns>/models/<model>``: one OCI image manifest per artefact, tagged with its key. Its ``artifactType`` is
  ``ARTIFACT_TYPE``, its config blob is the enginesmith manifest, and each file is a layer whose
  ``org.opencontainers.image.title`` is the file's path (ORAS pulls that into identical files); the signature, when
  there is one, is a layer too. The layers are mounted from ``<ns>/blobs`` (a cross-repository mount: no bytes move).
  Channels are tags ``channel.<name>`` on the same manifest.
- ``<ns>/stages/<stage>`` and ``<ns>/history/<model>``: stage and history records, one config-only artifact each,
  tagged with its key or entry name.

A blob goes up in chunks of one upload session; a publish killed half-way continues that session where the server's
upload status says it stopped, and a pull resumes a cut read with a range request, as on every store. A session that
cannot be continued (the next run starts the blob again from 0) or whose bytes came out wrong is cancelled with a
``DELETE`` on its URL, as the distribution spec provides, so its bytes do not stay on the server. Where the server
refuses that too (distribution 2.x answers every request on a session whose signed state is behind the bytes it
stored, after a kill mid-chunk, with ``BLOB_UPLOAD_INVALID``), the session is left to the server's own upload
purging (distribution: ``storage.maintenance.uploadpurging``), and a log line says so.

What OCI cannot do, and what this store does instead: there is no conditional manifest PUT, so "create once" checks
the tag first and reads it back after the PUT (two publishers racing on one key both write the same artefact; the
later manifest stays), and a channel moves only if it still points where it was read, checked just before the PUT.
Blobs cannot be listed or deleted through the API on every server, so ``list_blobs`` yields nothing and ``gc``
deletes manifests only: unreferenced blobs are the server's own garbage collection (``registry garbage-collect``).
Without the referrers API (distribution 2.x), nothing here needs it: records are tagged artifacts of their own.

Credentials: ``ENGINESMITH_OCI_USERNAME`` / ``ENGINESMITH_OCI_PASSWORD``, else what the Docker config holds for the
host (``registry.docker_config``: credential helpers, then ``auths``); HTTP basic, or the bearer token flow a
``WWW-Authenticate: Bearer`` challenge asks for. A custom CA: ``SSL_CERT_FILE``. No credential or token
appears in a message (they are registered secrets).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import ssl
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urljoin

import httpx

from enginesmith.core.errors import UserError
from enginesmith.core.locks import exclusive
from enginesmith.core.secrets import register_secret
from registry.docker_config import credentials_for
from registry.errors import ForeignRecordError, IntegrityError, NotFoundError, RegistryUnavailableError
from registry.manifest import SIGNATURE_FILE
from registry.store import BlobInfo, RefState, StageFile
from registry.transfer import RateLimiter, TransferProgress, file_chunks, rechunk, sha256_file

log = logging.getLogger(__name__)

ARTIFACT_TYPE = "application/vnd.enginesmith.artefact.v1"
RECORD_TYPE = "application/vnd.enginesmith.record.v1"
MANIFEST_CONFIG_TYPE = "application/vnd.enginesmith.manifest.v1+json"
RECORD_CONFIG_TYPE = "application/vnd.enginesmith.record.v1+json"
LAYER_TYPE = "application/octet-stream"
SIGNATURE_LAYER_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
TITLE = "org.opencontainers.image.title"
KEY_ANNOTATION = "dev.enginesmith.key"
CHANNEL_TAG_PREFIX = "channel."
CHUNK_BYTES = 16 * 1024 * 1024
TIMEOUT = httpx.Timeout(30.0, read=120.0)
_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
MAX_TAG_LENGTH = 128  # the distribution spec's
_TAG = re.compile(rf"^[A-Za-z0-9_][A-Za-z0-9._-]{{0,{MAX_TAG_LENGTH - 1}}}$")
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')
_URL_HINT = "write oci://host[:port]/namespace (HTTPS) or oci+http://host:port/namespace (plain HTTP)"


def parse_oci_url(url: str) -> tuple[str, str, str]:
    """(scheme, host[:port], namespace) of an ``oci://`` or ``oci+http://`` registry URL; raises ``UserError`` for one
    without a host, with an empty port, or without a namespace."""
    scheme = "https" if url.startswith("oci://") else "http"
    rest = url.split("://", 1)[1]
    host, _, namespace = rest.partition("/")
    if "@" in host:  # not repeated in the message: what precedes the @ is a password
        raise UserError("the registry URL holds credentials (user[:password]@host): they would be shown in every "
                        "message and record that names the registry", where="--registry",
                        hint="drop them from the URL; set ENGINESMITH_OCI_USERNAME/ENGINESMITH_OCI_PASSWORD, or "
                             "`docker login` the host")
    namespace = namespace.strip("/")
    if not host or host.startswith(":"):
        raise UserError(f"{url!r} names no registry host", where="--registry", hint=_URL_HINT)
    if host.endswith(":") or (":" in host and not host.rsplit(":", 1)[1].isdigit()):
        raise UserError(f"{url!r} has an empty or non-numeric port", where="--registry", hint=_URL_HINT)
    if not namespace:
        raise UserError(f"{url!r} names no namespace (the repository path the artefacts go under)",
                        where="--registry", hint=_URL_HINT)
    bad = [part for part in namespace.split("/") if not _COMPONENT.match(part)]
    if bad:
        raise UserError(f"namespace component {bad[0]!r} is not a valid OCI repository name (lower-case letters, "
                        "digits, and '.', '_' or '-' between them)", where="--registry", hint=_URL_HINT)
    return scheme, host, namespace


class OciStore:
    """A registry under a namespace of an OCI distribution registry."""

    def __init__(self, url: str) -> None:
        self.scheme, self.host, self.namespace = parse_oci_url(url)
        self._base = f"{self.scheme}://{self.host}"
        base = httpx.URL(self._base)
        self._origin = (base.scheme, base.host, base.port)  # where credentials may go
        self._auth = _Authenticator(self.host)
        self._client_lock = threading.Lock()
        self._http: httpx.Client | None = None
        self._api_checked = False

    @property
    def location(self) -> str:
        return f"oci{'+http' if self.scheme == 'http' else ''}://{self.host}/{self.namespace}"

    @property
    def identity(self) -> str:
        return f"oci://{self.host.lower()}/{self.namespace}"

    @property
    def shares_namespace(self) -> bool:
        return True

    def __repr__(self) -> str:
        return f"OciStore({self.location!r})"

    # --- blobs ---------------------------------------------------------------------------------------

    def blob_size(self, digest: str) -> int | None:
        response = self._request("HEAD", self._blobs_repo, f"blobs/sha256:{digest}", what="blob", missing_ok=True)
        return None if response is None else int(response.headers.get("content-length", 0))

    def put_blob(self, digest: str, source: Path, *, limiter: RateLimiter | None = None,
                 progress: TransferProgress | None = None, name: str = "") -> int:
        from registry.cache import default_cache_dir

        size = source.stat().st_size
        if self.blob_size(digest) == size:
            return size
        state = default_cache_dir() / "oci-uploads" / hashlib.sha256(self.location.encode()).hexdigest()[:16] / digest
        # One upload session per blob at a time: two publishes sharing the cache (two cells with one tokenizer)
        # would otherwise both continue the same session and collide. The second waits, then finds the blob there.
        with exclusive(state.with_name(f"{digest}.lock"), best_effort=True,
                       waiting_message=f"{name or digest[:12]}: another publish is uploading it; waiting"):
            if self.blob_size(digest) == size:
                return size
            if progress is not None:
                progress.started(name, size, 0)
            try:
                return self._upload(self._blobs_repo, digest, source, size, state, limiter, progress, name)
            finally:
                if progress is not None:
                    progress.finished(name)

    def _upload(self, repo: str, digest: str, source: Path, size: int, state: Path, limiter: RateLimiter | None,
                progress: TransferProgress | None, name: str) -> int:
        """A chunked upload session: POST to open it, PATCH each chunk with its Content-Range, PUT with the digest.

        The session's URL is kept in ``state`` (in the cache: ``<cache>/oci-uploads``) after every chunk, so a
        publish killed half-way continues the same session from the offset the server reports (an upload status
        GET); returns the bytes it did not send again. A session the server no longer knows is started anew."""
        location, offset = self._open_session(repo, state)
        if progress is not None and offset:
            progress.advanced(name, offset)
        hasher = hashlib.sha256()
        with source.open("rb", buffering=0) as reader:
            if offset:
                hasher = sha256_file(reader, offset)
                reader.seek(offset)
            start = offset

            def sent(location: str, offset: int, count: int) -> None:
                _keep_session(state, location, offset)
                if progress is not None:
                    progress.advanced(name, count)

            # bytes(): the reader reuses its buffer, and a request keeps the bytes it sends
            chunks = (bytes(view) for view in file_chunks(reader, chunk_bytes=CHUNK_BYTES))
            location = self._send_chunks(repo, location, offset, chunks, hasher, limiter=limiter, sent=sent)
        if hasher.hexdigest() != digest:
            self._cancel_upload(repo, location)
            state.unlink(missing_ok=True)
            raise IntegrityError(f"content has sha256 {hasher.hexdigest()}, not {digest}", where=name or str(source),
                                 hint="the file changed while it was being published; rebuild the artefact")
        self._close_upload(repo, location, digest)
        state.unlink(missing_ok=True)
        return start

    def _send_chunks(self, repo: str, location: str, offset: int, chunks: Iterable[bytes], hasher: hashlib._Hash,
                     *, limiter: RateLimiter | None = None,
                     sent: Callable[[str, int, int], None] | None = None) -> str:
        """PATCH ``chunks`` into the upload session at ``location`` from ``offset``, each with its Content-Range,
        feeding ``hasher``; ``sent(location, offset, count)`` after each. Returns the session's last location."""
        for chunk in chunks:
            hasher.update(chunk)
            if limiter is not None:
                limiter.consume(len(chunk))
            patched = self._request("PATCH", repo, location, what="blob upload", body=chunk, expect=(202,),
                                    headers={"Content-Type": LAYER_TYPE,
                                             "Content-Range": f"{offset}-{offset + len(chunk) - 1}"})
            assert patched is not None
            location = self._upload_location(patched, repo)
            offset += len(chunk)
            if sent is not None:
                sent(location, offset, len(chunk))
        return location

    def _close_upload(self, repo: str, location: str, digest: str, body: bytes | None = None) -> None:
        separator = "&" if "?" in location else "?"
        self._request("PUT", repo, f"{location}{separator}{urlencode({'digest': f'sha256:{digest}'})}",
                      what="blob upload", body=body, expect=(201,),
                      headers={"Content-Type": LAYER_TYPE} if body is not None else {"Content-Length": "0"})

    def _open_session(self, repo: str, state: Path) -> tuple[str, int]:
        """The upload session a killed publish left (its URL and the bytes the server holds), else a new one (the
        left one cancelled)."""
        if state.is_file():
            kept: Any = None
            try:
                kept = json.loads(state.read_text())
                status = self._request("GET", repo, kept["location"], what="upload status", expect=(204,))
            except (UserError, ValueError, KeyError, TypeError):
                status = None  # unreadable, unknown to the server, or behind it (killed between a chunk and this file)
            reported = re.fullmatch(r"0-(\d+)", status.headers.get("range", "")) if status is not None else None
            if status is not None and reported:
                # "0-0" is how distribution reports both no byte and one byte: an offset this file never recorded is 0
                stored = int(reported.group(1)) + 1 if kept.get("offset") or int(reported.group(1)) else 0
                # The server's word, not this file's: a kill mid-chunk may have left it ahead of the last offset kept
                # (a registry that allows that answers with where to go on; distribution 2.x refuses the session).
                location = self._upload_location(status, repo) if status.headers.get("location") else kept["location"]
                return str(location), stored
            if isinstance(kept, dict) and isinstance(kept.get("location"), str):
                self._cancel_upload(repo, kept["location"])  # starting again from 0: its bytes would stay there
            state.unlink(missing_ok=True)
        opened = self._request("POST", repo, "blobs/uploads/", what="blob upload", expect=(202,))
        assert opened is not None
        location = self._upload_location(opened, repo)
        _keep_session(state, location, 0)
        return location, 0

    def _cancel_upload(self, repo: str, location: str) -> bool:
        """Cancel an upload session this store abandons (``DELETE`` on its URL); False where the server refused."""
        try:
            self._request("DELETE", repo, location, what="upload cancel", expect=(202, 204))
            return True
        except UserError as refused:
            if "BLOB_UPLOAD_UNKNOWN" in refused.message:  # gone already (purged, or never stored)
                return True
            log.info("%s: an abandoned upload session could not be cancelled (%s); the registry's upload purging "
                     "removes it (distribution: storage.maintenance.uploadpurging)", self.location, refused.message)
            return False

    def _put_bytes(self, repo: str, body: bytes) -> str:
        digest = hashlib.sha256(body).hexdigest()
        if self._request("HEAD", repo, f"blobs/sha256:{digest}", what="blob", missing_ok=True) is None:
            opened = self._request("POST", repo, "blobs/uploads/", what="blob upload", expect=(202,))
            assert opened is not None
            self._close_upload(repo, self._upload_location(opened, repo), digest, body)
        return digest

    def _mount(self, repo: str, digest: str) -> None:
        """Make a blob of ``<ns>/blobs`` part of ``repo``: a cross-repository mount, else (a server that does not mount)
        the bytes copied through this client."""
        if self._request("HEAD", repo, f"blobs/sha256:{digest}", what="blob", missing_ok=True) is not None:
            return
        query = urlencode({"mount": f"sha256:{digest}", "from": self._blobs_repo})
        response = self._request("POST", repo, f"blobs/uploads/?{query}", what="blob mount", expect=(201, 202))
        assert response is not None
        if response.status_code == 201:
            return
        # The server opened an upload instead of mounting: copy the blob through this client, a chunk at a time.
        hasher = hashlib.sha256()
        location = self._send_chunks(repo, self._upload_location(response, repo), 0,
                                     rechunk(self.read_blob(digest), CHUNK_BYTES), hasher)
        if hasher.hexdigest() != digest:
            self._cancel_upload(repo, location)
            raise IntegrityError(f"blob sha256:{digest} read back from {self._blobs_repo} has sha256 "
                                 f"{hasher.hexdigest()}", where=self.location,
                                 hint="the registry's copy is damaged: re-publish the artefact")
        self._close_upload(repo, location, digest)

    def read_blob(self, digest: str, offset: int = 0) -> Generator[bytes, None, None]:
        return self._read_blob(self._blobs_repo, digest, offset)

    def _read_blob(self, repo: str, digest: str, offset: int) -> Generator[bytes, None, None]:
        headers = {"Range": f"bytes={offset}-"} if offset else {}
        with self._stream("GET", repo, f"blobs/sha256:{digest}", headers=headers) as response:
            if response.status_code == 404:
                raise NotFoundError(f"blob sha256:{digest} is missing from the registry", where=self.location,
                                    hint="re-publish the artefact that lists it")
            if response.status_code == 416 and offset:  # a partial file as long as the blob: nothing to add
                return
            if response.status_code not in (200, 206):
                raise self._status_error(response, "blob read")
            skip = offset if response.status_code == 200 else 0  # a server that ignored the range sends it all
            try:
                # As the network delivers them: a chunk size would hold bytes back, lost when a read is cut.
                for chunk in response.iter_bytes():
                    if skip:
                        dropped = min(skip, len(chunk))
                        chunk, skip = chunk[dropped:], skip - dropped
                    if chunk:
                        yield chunk
            except httpx.TransportError as exc:
                raise RegistryUnavailableError(f"the blob read stopped: {type(exc).__name__}", where=self.location,
                                               hint="run the same command again; it resumes") from None

    def list_blobs(self) -> Generator[BlobInfo, None, None]:
        """Nothing: the distribution API cannot list blobs. Unreferenced blobs are the server's garbage collection."""
        yield from ()

    def delete_blob(self, digest: str) -> None:
        self._request("DELETE", self._blobs_repo, f"blobs/sha256:{digest}", what="blob delete", missing_ok=True,
                      expect=(202, 405))

    # --- manifests -----------------------------------------------------------------------------------

    def create_manifest(self, model: str, key: str, body: bytes) -> bool:
        repo = self._model_repo(model)
        if self._manifest_digest(repo, key) is not None:
            return False
        document = json.loads(body)
        signature = document.get("signature")
        contents = [(f["sha256"], f["size"], f["path"], LAYER_TYPE) for f in document["artefact"]["files"]]
        if signature:
            contents.append((signature["sha256"], signature["size"], SIGNATURE_FILE, SIGNATURE_LAYER_TYPE))
        return self._put_artifact(repo, key, body, MANIFEST_CONFIG_TYPE, ARTIFACT_TYPE, self._layers(repo, contents))

    def _layers(self, repo: str, contents: list[tuple[str, int, str, str]]) -> list[dict[str, Any]]:
        """Layer descriptors of ``contents`` (sha256, size, title, media type), each blob mounted into ``repo``
        once: a manifest's layers must be blobs of its own repository."""
        for digest in dict.fromkeys(digest for digest, *_ in contents):
            self._mount(repo, digest)
        return [{"mediaType": media_type, "digest": f"sha256:{digest}", "size": size, "annotations": {TITLE: title}}
                for digest, size, title, media_type in contents]

    def read_manifest(self, model: str, key: str) -> bytes | None:
        return self._read_artifact(self._model_repo(model), key, MANIFEST_CONFIG_TYPE)

    def delete_manifest(self, model: str, key: str) -> None:
        self._delete_tagged(self._model_repo(model), key)

    def list_models(self) -> list[str]:
        prefix = f"{self.namespace}/models/"
        return sorted(repo.removeprefix(prefix) for repo in self._catalog() if repo.startswith(prefix)
                      and "/" not in repo.removeprefix(prefix))

    def list_manifest_keys(self, model: str) -> list[str]:
        return sorted(tag for tag in self._tags(self._model_repo(model)) if not tag.startswith(CHANNEL_TAG_PREFIX))

    # --- records -------------------------------------------------------------------------------------

    def create_stage(self, stage: str, key: str, body: bytes, files: Sequence[StageFile] = ()) -> bool:
        # The files are layers, mounted into the stage's repository: the server's garbage collection keeps a blob
        # only while some manifest lists it.
        repo = self._repo("stages", stage)
        contents = [(f.sha256, f.size, f.path, LAYER_TYPE) for f in files]
        return self._create_record(repo, key, body, self._layers(repo, contents))

    def read_stage(self, stage: str, key: str) -> bytes | None:
        return self._read_artifact(self._repo("stages", stage), key, RECORD_CONFIG_TYPE)

    def list_stage_keys(self, stage: str) -> list[str]:
        return sorted(self._tags(self._repo("stages", stage)))

    def delete_stage(self, stage: str, key: str) -> None:
        self._delete_tagged(self._repo("stages", stage), key)

    def create_history(self, model: str, entry: str, body: bytes) -> bool:
        return self._create_record(self._repo("history", model), entry, body, [])

    def read_history(self, model: str, entry: str) -> bytes | None:
        return self._read_artifact(self._repo("history", model), entry, RECORD_CONFIG_TYPE)

    def list_history(self, model: str) -> list[str]:
        return sorted(self._tags(self._repo("history", model)))

    def _create_record(self, repo: str, tag: str, body: bytes, layers: list[dict[str, Any]]) -> bool:
        if self._manifest_digest(repo, tag) is not None:
            return False
        return self._put_artifact(repo, tag, body, RECORD_CONFIG_TYPE, RECORD_TYPE, layers)

    # --- refs ----------------------------------------------------------------------------------------

    def read_ref(self, model: str, channel: str) -> RefState | None:
        found = self._get_manifest(self._model_repo(model), self._channel_tag(channel))
        if found is None:
            return None
        document, digest = found
        key = document.get("annotations", {}).get(KEY_ANNOTATION)
        if not isinstance(key, str):
            raise IntegrityError(f"channel {channel!r} points at a manifest enginesmith did not write",
                                 where=f"{self.location}/models/{model}", hint="move the channel with `promote`")
        return RefState(key=key, version=digest)

    def write_ref(self, model: str, channel: str, key: str, expected: RefState | None) -> bool:
        repo = self._model_repo(model)
        current = self.read_ref(model, channel)
        if (current is None) != (expected is None) or (current and expected and current.version != expected.version):
            return False
        found = self._get_manifest(repo, key, raw=True)
        if found is None:
            raise NotFoundError(f"no manifest {model}@{key} to point {channel!r} at", where=self.location)
        body, _ = found
        assert isinstance(body, bytes)
        self._request("PUT", repo, f"manifests/{self._channel_tag(channel)}", what="channel move", body=body,
                      expect=(201,), headers={"Content-Type": OCI_MANIFEST})
        return True

    def list_channels(self, model: str) -> list[str]:
        return sorted(tag.removeprefix(CHANNEL_TAG_PREFIX) for tag in self._tags(self._model_repo(model))
                      if tag.startswith(CHANNEL_TAG_PREFIX))

    def require_exists(self, where: str) -> None:
        pass  # a namespace is a prefix of repository names, listed only by _catalog, which many registries lack

    def delete_stale_uploads(self, older_than_s: float, *, now: float | None = None) -> int:
        """Nothing to do from here: the server purges upload sessions left open (distribution: ``uploadpurging``)."""
        return 0

    # --- OCI artifacts -------------------------------------------------------------------------------

    def _put_artifact(self, repo: str, tag: str, config: bytes, config_type: str, artifact_type: str,
                      layers: list[dict[str, Any]]) -> bool:
        config_digest = self._put_bytes(repo, config)
        manifest = {
            "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": artifact_type,
            "config": {"mediaType": config_type, "digest": f"sha256:{config_digest}", "size": len(config)},
            "layers": layers, "annotations": {KEY_ANNOTATION: tag},
        }
        body = json.dumps(manifest, sort_keys=True).encode()
        self._request("PUT", repo, f"manifests/{self._tag(tag)}", what="manifest", body=body, expect=(201,),
                      headers={"Content-Type": OCI_MANIFEST})
        # No conditional PUT in OCI: of two racing writers, the one whose manifest the tag holds now created it.
        return self._manifest_digest(repo, tag) == f"sha256:{hashlib.sha256(body).hexdigest()}"

    def _read_artifact(self, repo: str, tag: str, config_type: str) -> bytes | None:
        found = self._get_manifest(repo, tag)
        if found is None:
            return None
        document, _ = found
        assert isinstance(document, dict)
        config = document.get("config") or {}
        if config.get("mediaType") != config_type:
            raise ForeignRecordError(f"{repo}:{tag} is an OCI artifact of type {document.get('artifactType') or '?'} "
                                 f"(config {config.get('mediaType')}), not one enginesmith wrote",
                                 where=self.location, hint="push artefacts with `enginesmith publish`")
        digest = str(config.get("digest", "")).removeprefix("sha256:")
        body = b"".join(self._read_blob(repo, digest, 0))
        if hashlib.sha256(body).hexdigest() != digest:
            raise IntegrityError(f"{repo}:{tag}: its config blob does not match sha256 {digest}", where=self.location)
        return body

    def _delete_tagged(self, repo: str, tag: str) -> None:
        """Delete the manifest ``tag`` names (by its digest: the API deletes manifests, not tags), if there is one."""
        digest = self._manifest_digest(repo, tag)
        if digest is not None:
            self._request("DELETE", repo, f"manifests/{digest}", what="manifest delete", missing_ok=True,
                          expect=(202,))

    def _manifest_digest(self, repo: str, tag: str) -> str | None:
        response = self._request("HEAD", repo, f"manifests/{self._tag(tag)}", what="manifest", missing_ok=True,
                                 headers={"Accept": OCI_MANIFEST})
        if response is None:
            return None
        digest = response.headers.get("docker-content-digest")
        if digest:
            return str(digest)
        # The header is a SHOULD of the spec: without it, the digest of the manifest's bytes, read whole.
        found = self._get_manifest(repo, tag, raw=True)
        return None if found is None else found[1]

    def _get_manifest(self, repo: str, tag: str, *, raw: bool = False) -> tuple[Any, str] | None:
        response = self._request("GET", repo, f"manifests/{self._tag(tag)}", what="manifest", missing_ok=True,
                                 headers={"Accept": OCI_MANIFEST})
        if response is None:
            return None
        digest = (response.headers.get("docker-content-digest")
                  or f"sha256:{hashlib.sha256(response.content).hexdigest()}")
        if raw:
            return response.content, digest
        try:
            return json.loads(response.content), digest
        except json.JSONDecodeError:
            raise IntegrityError(f"{repo}:{tag} is not a JSON manifest", where=self.location) from None

    def _tags(self, repo: str) -> list[str]:
        return list(self._paginated(repo, "tags/list", "tags"))

    def _catalog(self) -> list[str]:
        """Every repository of the registry (``/v2/_catalog``). Registries without that API (ECR, GHCR, Docker Hub)
        answer 404: an error, not an empty registry."""
        return list(self._paginated(None, "/v2/_catalog", "repositories", missing=UserError(
            "the registry does not offer the _catalog API, which listing every model needs", where=self.location,
            hint="name the model where the command takes one (enginesmith ls MODEL)")))

    def _paginated(self, repo: str | None, path: str, field: str, *,
                   missing: UserError | None = None) -> Iterator[str]:
        """The ``field`` lists of each page; a 404 is an empty list, or ``missing`` raised where one is given."""
        next_path: str | None = f"{path}?n=1000"
        while next_path:
            response = self._request("GET", repo, next_path, what="listing", missing_ok=True)
            if response is None:
                if missing is not None:
                    raise missing
                return
            yield from (response.json().get(field) or [])
            link = response.headers.get("link", "")
            match = re.match(r"<([^>]+)>", link)
            next_path = match.group(1) if match else None

    # --- names ---------------------------------------------------------------------------------------

    @property
    def _blobs_repo(self) -> str:
        return f"{self.namespace}/blobs"

    def _model_repo(self, model: str) -> str:
        return self._repo("models", model)

    def _repo(self, kind: str, name: str) -> str:
        if not _COMPONENT.match(name):
            raise UserError(f"{name!r} cannot name an OCI repository (lower-case letters and digits, with '.', '_' "
                            "or '-' between them)", where=f"{self.location}/{kind}",
                            hint="an OCI registry takes lower-case model names only")
        return f"{self.namespace}/{kind}/{name}"

    @staticmethod
    def _tag(tag: str) -> str:
        if not _TAG.match(tag):
            raise UserError(f"{tag!r} is not a valid OCI tag (at most 128 letters, digits, '.', '_', '-')",
                            where="tag")
        return tag

    def _channel_tag(self, channel: str) -> str:
        tag = CHANNEL_TAG_PREFIX + channel
        if len(tag) > MAX_TAG_LENGTH:
            raise UserError(f"channel {channel[:24]!r}… is {len(channel)} characters; on an OCI registry a channel is "
                            f"the tag {CHANNEL_TAG_PREFIX!r} + its name, at most {MAX_TAG_LENGTH} in all",
                            where="--channel",
                            hint=f"use a channel name of at most {MAX_TAG_LENGTH - len(CHANNEL_TAG_PREFIX)} characters")
        return self._tag(tag)

    # --- HTTP ----------------------------------------------------------------------------------------

    def _client(self) -> httpx.Client:
        with self._client_lock:
            if self._http is None:
                self._http = httpx.Client(timeout=TIMEOUT, follow_redirects=True, trust_env=True)
            if not self._api_checked:
                self._check_api(self._http)
                self._api_checked = True
            return self._http

    def _check_api(self, client: httpx.Client) -> None:
        """Is there a registry at all? A web server that is not one would answer every listing 404, which reads as
        an empty registry. The spec's base endpoint answers 200 (distribution: with its API version header, JSON)
        or 401 (credentials needed first)."""
        try:
            response = client.get(f"{self._base}/v2/")
        except httpx.TransportError as exc:
            raise self._transport_error(exc, "registry API check", hint="check that the registry is up and the "
                                                                        "URL's scheme and port") from None
        kind = response.headers.get("content-type", "").split(";")[0] or "no content type"
        api = response.headers.get("docker-distribution-api-version", "")
        if response.status_code == 401 or (response.status_code == 200 and (api or kind == "application/json")):
            return
        if response.status_code == 400:  # e.g. plain HTTP to a TLS server: the status error says which scheme to use
            raise self._status_error(response, "registry API check")
        raise UserError(f"{self._base} is not an OCI registry: GET /v2/ answered {response.status_code} ({kind})",
                        where=self.location, hint=_URL_HINT)

    def _url(self, repo: str | None, path: str) -> str:
        if path.startswith(("http://", "https://")):
            return path
        if path.startswith("/"):
            return urljoin(self._base, path)
        return f"{self._base}/v2/{repo}/{path}"

    def _auth_header(self, url: str, scope: str) -> dict[str, str]:
        """Our credentials, for a URL of the registry's own origin only: an upload or page URL the server chose may
        point elsewhere (another host, or plain HTTP behind a TLS proxy), and gets none."""
        target = httpx.URL(url)
        same = (target.scheme, target.host, target.port) == self._origin
        return self._auth.header(scope) if same else {}

    def _upload_location(self, response: httpx.Response, repo: str) -> str:
        location = response.headers.get("location")
        if not location:
            raise RegistryUnavailableError("the registry opened an upload without a Location", where=self.location)
        # Relative to the URL that answered (the spec allows a relative Location), as a browser resolves a link.
        return urljoin(str(response.url), location)

    def _request(self, method: str, repo: str | None, path: str, *, what: str, body: bytes | None = None,
                 headers: dict[str, str] | None = None, missing_ok: bool = False,
                 expect: tuple[int, ...] = (200,)) -> httpx.Response | None:
        url = self._url(repo, path)
        scope = _scope(repo, method)
        for attempt in range(2):
            try:
                response = self._client().request(method, url, content=body,
                                                  headers={**(headers or {}), **self._auth_header(url, scope)})
            except httpx.TransportError as exc:
                raise self._transport_error(exc, what, hint="check that the registry is up and the URL's scheme "
                                                            "and port") from None
            if response.status_code == 401 and attempt == 0 and self._auth.answer(response, scope, self._client()):
                continue
            break
        if response.status_code == 404 and missing_ok:
            return None
        if response.status_code in expect or (method in ("GET", "HEAD") and response.status_code == 200):
            return response
        raise self._status_error(response, what)

    @contextmanager
    def _stream(self, method: str, repo: str, path: str, *, headers: dict[str, str]) -> Iterator[httpx.Response]:
        url, scope = self._url(repo, path), _scope(repo, method)
        for attempt in range(2):
            try:
                sent = {**headers, **self._auth_header(url, scope)}
                with self._client().stream(method, url, headers=sent) as response:
                    if response.status_code == 401 and attempt == 0:
                        response.read()
                        if self._auth.answer(response, scope, self._client()):
                            continue
                    yield response
                    return
            except httpx.TransportError as exc:
                raise self._transport_error(exc, "blob read", hint="run the same command again; it resumes") from None

    def _transport_error(self, error: httpx.TransportError, what: str, *, hint: str) -> UserError:
        """A failed connection as an error to show. A certificate this machine does not trust, or TLS spoken to a
        plain-HTTP port, is the URL's or the machine's set-up, not an outage: a ``UserError`` that retrying
        cannot fix, with what to change. Anything else: ``RegistryUnavailableError``, which a pull retries."""
        cause = _tls_cause(error)
        if isinstance(cause, ssl.SSLCertVerificationError):
            return UserError(f"{what}: the registry's TLS certificate is not trusted here ({cause.verify_message})",
                             where=self.location,
                             hint="point SSL_CERT_FILE at a PEM bundle that holds the CA which signed it (or "
                                  "SSL_CERT_DIR at a directory of them)")
        if cause is not None and ("WRONG_VERSION_NUMBER" in str(cause) or "record layer failure" in str(cause)):
            return UserError(f"{what}: the registry did not answer TLS ({cause})", where=self.location,
                             hint=f"for a plain-HTTP registry use oci+http://{self.host}/{self.namespace}")
        return RegistryUnavailableError(f"{what}: {type(error).__name__}: {error}", where=self.location, hint=hint)

    def _status_error(self, response: httpx.Response, what: str) -> UserError:
        code = response.status_code
        detail = ""
        try:
            errors = response.json().get("errors") or []
            detail = "; ".join(f"{e.get('code')}: {e.get('message')}" for e in errors if isinstance(e, dict))
        except (json.JSONDecodeError, ValueError, AttributeError, httpx.ResponseNotRead):
            pass
        text = f"{what}: HTTP {code}" + (f" ({detail})" if detail else "")
        if code == 401:
            return UserError(f"{text}: the registry refused the credentials", where=self.location,
                             hint="set ENGINESMITH_OCI_USERNAME and ENGINESMITH_OCI_PASSWORD, or `docker login` "
                                  f"{self.host}")
        if code == 403:
            return UserError(f"{text}: not allowed", where=self.location, hint="ask for push/pull rights")
        if code == 400 and self.scheme == "http" and "HTTPS server" in _text_of(response):
            return UserError(f"{text}: the registry speaks HTTPS", where=self.location,
                             hint=f"use oci://{self.host}/{self.namespace}")
        if code >= 500 or code == 429:
            return RegistryUnavailableError(text, where=self.location, hint="run the same command again")
        return UserError(text, where=self.location)


def _keep_session(state: Path, location: str, offset: int) -> None:
    """Record an upload session's URL and the bytes it holds (written whole, then renamed: never half a record)."""
    state.parent.mkdir(parents=True, exist_ok=True)
    partial = state.with_name(f".{state.name}.{os.getpid()}")
    partial.write_text(json.dumps({"location": location, "offset": offset}))
    os.replace(partial, state)


def _text_of(response: httpx.Response) -> str:
    """The body of a small error answer as text ("" where it was streamed and not read)."""
    try:
        return response.text[:512]
    except httpx.ResponseNotRead:
        return ""


def _tls_cause(error: BaseException) -> ssl.SSLError | None:
    """The ``ssl.SSLError`` behind an httpx error (httpx wraps httpcore's, which wraps the ssl module's), if any."""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _scope(repo: str | None, method: str) -> str:
    if repo is None:
        return "registry:catalog:*"
    actions = "pull" if method in ("GET", "HEAD") else "pull,push,delete" if method == "DELETE" else "pull,push"
    return f"repository:{repo}:{actions}"


class _Authenticator:
    """Answers a registry's 401 challenge: HTTP basic with the credentials found, or a bearer token from the realm the
    challenge names (per scope, kept until the registry refuses it again)."""

    def __init__(self, host: str) -> None:
        self.host = host
        self._lock = threading.Lock()
        self._basic: str | None = None
        self._tokens: dict[str, str] = {}
        self._credentials_read = False
        self._credentials: tuple[str, str] | None = None

    def header(self, scope: str) -> dict[str, str]:
        with self._lock:
            if scope in self._tokens:
                return {"Authorization": f"Bearer {self._tokens[scope]}"}
            if self._basic is not None:
                return {"Authorization": f"Basic {self._basic}"}
        return {}

    def answer(self, response: httpx.Response, scope: str, client: httpx.Client) -> bool:
        """Prepare the header for a retry of the refused request; False when there is nothing new to try."""
        challenge = response.headers.get("www-authenticate", "")
        scheme = challenge.split(" ", 1)[0].lower()
        credentials = self._read_credentials()
        with self._lock:
            if scheme == "basic":
                if credentials is None or self._basic is not None:
                    return False
                self._basic = base64.b64encode(f"{credentials[0]}:{credentials[1]}".encode()).decode()
                register_secret(self._basic)
                return True
            if scheme != "bearer":
                return False
            self._tokens.pop(scope, None)  # refused: an expired token is fetched again, once per request
        params = dict(_CHALLENGE_PARAM.findall(challenge))
        realm = params.get("realm")
        if not realm:
            return False
        # A challenge may name several scopes (a cross-repository mount: push here, pull there), one parameter each.
        query = ([("service", params["service"])] if params.get("service") else []) + [
            ("scope", one) for one in params.get("scope", scope).split()]
        auth = httpx.BasicAuth(*credentials) if credentials else None
        try:
            answered = client.get(realm, params=query, auth=auth)
        except httpx.TransportError as exc:
            raise RegistryUnavailableError(f"token endpoint: {type(exc).__name__}", where=realm) from None
        if answered.status_code != 200:
            return False
        try:
            granted = answered.json()
            token = granted.get("token") or granted.get("access_token")
        except (json.JSONDecodeError, ValueError, AttributeError):
            raise RegistryUnavailableError(f"the token endpoint answered HTTP 200 without a JSON token "
                                           f"({answered.headers.get('content-type') or 'no content type'})",
                                           where=realm, hint="check the registry's token service") from None
        if not token:
            return False
        with self._lock:
            self._tokens[scope] = register_secret(token) or token
        return True

    def _read_credentials(self) -> tuple[str, str] | None:
        with self._lock:
            if not self._credentials_read:
                self._credentials = credentials_for(self.host)
                self._credentials_read = True
            return self._credentials
