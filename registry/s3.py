"""The S3-compatible backend (boto3, imported here only).

The commit points are S3's conditional writes: a manifest is created with ``If-None-Match: *`` (so it is
exclusive, and S3 objects are never visible half-written), a ref is moved with ``If-Match: <etag>``.

A big blob goes up as a multipart upload that outlives the process: the next publish of the same blob finds it
(its key is the blob's), keeps the parts whose size and MD5 match the local file, and sends only the rest.
Concurrent publishers of one blob may share an upload: every part's bytes are fixed by the blob's digest, so
writing a part twice, or completing twice, stores the same object.
Credentials come from boto3's usual chain (environment, ``~/.aws`` files, instance roles); the secret parts
are registered with ``enginesmith.core.secrets`` as they are read, so no message or log record can show them.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enginesmith.core.errors import UserError
from enginesmith.core.secrets import register_secret, scrub
from registry.errors import IntegrityError, NotFoundError, RegistryUnavailableError
from registry.manifest import utc_timestamp
from registry.names import (
    MANIFEST_SUFFIX,
    blob_path,
    history_dir,
    history_path,
    is_digest,
    is_name,
    manifest_dir,
    manifest_path,
    ref_path,
    refs_dir,
    stage_dir,
    stage_path,
)
from registry.store import BlobInfo, RefState, StageFile
from registry.transfer import NETWORK_CHUNK_BYTES, NoProgress, RateLimiter, TransferProgress

# Parts small enough that a retried or re-sent part costs little and a loaded server is not handed
# jobs × threads × part bytes at once; each part in flight is held in memory once.
MULTIPART_PART_BYTES = 16 * 1024 * 1024
MAX_PARTS = 10_000  # S3's limit per upload: a bigger blob gets bigger parts
UPLOAD_THREADS_PER_BLOB = 2
REQUEST_ATTEMPTS = 4
CONDITIONAL_CONFLICT_RETRIES = 5
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_CREDENTIALS_HINT = ("check the AWS credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
                     "or ~/.aws/credentials")


# Where boto3 takes an endpoint from when none is given, first found first.
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
PART_SIZE_ENV = "ENGINESMITH_S3_PART_MIB"
MIN_PART_BYTES = 5 * 1024 * 1024  # S3's smallest part (but the last)


def _part_bytes_setting() -> int:
    """The multipart part size ``ENGINESMITH_S3_PART_MIB`` sets (as the AWS CLI's multipart_chunksize), else the
    default. A kill mid-upload loses at most the parts in flight (``UPLOAD_THREADS_PER_BLOB`` of them): smaller parts
    lose less and cost more requests."""
    text = os.environ.get(PART_SIZE_ENV, "").strip()
    if not text:
        return MULTIPART_PART_BYTES
    try:
        part_bytes = int(text) * 1024 * 1024
    except ValueError:
        part_bytes = 0
    if part_bytes < MIN_PART_BYTES:
        raise UserError(f"{PART_SIZE_ENV}={text!r} is not a part size S3 accepts", where=PART_SIZE_ENV,
                        hint="a whole number of MiB, at least 5 (default 16)")
    return part_bytes


def checked_endpoint(endpoint_url: str | None) -> str | None:
    """``endpoint_url`` (``--s3-endpoint``), or with none the endpoint boto3 would read from ``ENDPOINT_VARIABLES``,
    refused as a ``UserError`` unless it is an http(s) URL with a host: boto3 raises a bare ``ValueError`` when it
    makes the client. Returns ``endpoint_url`` (``None`` leaves the choice to boto3)."""
    if endpoint_url:
        # The CLI's flag also reads AWS_ENDPOINT_URL: name the variable where the value came from there.
        given_by = "AWS_ENDPOINT_URL" if os.environ.get("AWS_ENDPOINT_URL") == endpoint_url else "--s3-endpoint"
        _require_http_url(endpoint_url, given_by)
        return endpoint_url
    variable = next((name for name in ENDPOINT_VARIABLES if os.environ.get(name)), None)
    if variable is not None:
        _require_http_url(os.environ[variable], variable)
    return None


def _require_http_url(endpoint: str, given_by: str) -> None:
    parsed = urllib.parse.urlsplit(endpoint)
    try:
        port_ok = parsed.port is None or parsed.port > 0
    except ValueError:
        port_ok = False
    if parsed.scheme in ("http", "https") and parsed.hostname and port_ok:
        return
    example = endpoint if "://" not in endpoint else "127.0.0.1:8333"
    raise UserError(f"the S3 endpoint {endpoint!r} is not an http:// or https:// URL with a host", where=given_by,
                    hint=f"write it as http(s)://HOST[:PORT], e.g. http://{example}")


class S3Store:
    """A registry under ``s3://bucket/prefix`` on AWS S3 or any S3-compatible server (``endpoint_url``)."""

    def __init__(self, bucket: str, prefix: str = "", *, endpoint_url: str | None = None,
                 multipart_part_bytes: int = MULTIPART_PART_BYTES) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url or None
        self.multipart_part_bytes = multipart_part_bytes  # also the size from which uploads go in parts
        self._client_instance: Any = None
        self._client_lock = threading.Lock()

    @classmethod
    def from_url(cls, url: str, *, endpoint_url: str | None = None, where: str = "--registry") -> S3Store:
        """``s3://bucket[/prefix]`` → store; raises ``UserError`` for a malformed URL (named as ``where``) or
        endpoint."""
        if "@" in url:
            raise UserError("the registry URL must not carry credentials", where=where,
                            hint="give them through the AWS environment variables or ~/.aws/credentials")
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not _BUCKET.match(bucket):
            raise UserError(f"{bucket!r} is not an S3 bucket name", where=where,
                            hint="write s3://BUCKET/PREFIX, e.g. s3://engines/prod")
        return cls(bucket, prefix, endpoint_url=checked_endpoint(endpoint_url),
                   multipart_part_bytes=_part_bytes_setting())

    @property
    def location(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        return f"{where} at {self.endpoint_url}" if self.endpoint_url else where

    @property
    def identity(self) -> str:
        # boto3 takes the endpoint from the environment when none is given: the same bucket on another server is
        # another registry.
        endpoint = (self.endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
                    or "https://s3.amazonaws.com")
        return f"s3://{self.bucket}/{self.prefix} at {endpoint.rstrip('/').lower()}"

    @property
    def shares_namespace(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"S3Store({self.location!r})"

    # --- blobs ---------------------------------------------------------------------------------------

    def blob_size(self, digest: str) -> int | None:
        with self._errors("checking a blob"):
            try:
                head = self._client.head_object(Bucket=self.bucket, Key=self._key(blob_path(digest)))
            except self._client.exceptions.ClientError as exc:
                if _is_missing(exc):
                    return None
                raise
        return int(head["ContentLength"])

    def put_blob(self, digest: str, source: Path, *, limiter: RateLimiter | None = None,
                 progress: TransferProgress | None = None, name: str = "") -> int:
        size = source.stat().st_size
        progress = progress or NoProgress()
        if size < self.multipart_part_bytes:
            progress.started(name, size, 0)
            try:
                body = _read_span(source, 0, size, name or str(source))
                with self._errors(f"uploading {name or source}"):
                    self._client.put_object(Bucket=self.bucket, Key=self._key(blob_path(digest)),
                                            Body=_metered(body, limiter, progress, name), ContentLength=size,
                                            ContentMD5=_content_md5(body), Metadata={"sha256": digest})
            finally:
                progress.finished(name)
            return 0
        return self._put_in_parts(digest, source, size, limiter, progress, name)

    def _put_in_parts(self, digest: str, source: Path, size: int, limiter: RateLimiter | None,
                      progress: TransferProgress, name: str) -> int:
        """Upload ``source`` in parts, continuing an unfinished upload of the same blob; returns the bytes not sent
        (kept parts, or the whole blob when another publisher finished it first)."""
        label = name or str(source)
        key = self._key(blob_path(digest))
        parts = _split(size, max(self.multipart_part_bytes, -(-size // MAX_PARTS)))
        upload_id, stored = self._open_upload(key, digest, label)
        # Counted as done from the start; a part that fails its MD5 check is taken back off before it is sent.
        claimed: dict[int, list[_StoredPart]] = {}
        for part in parts:
            fitting = [candidate for candidate in stored.get(part.number, []) if candidate.size == part.length]
            if fitting:
                claimed[part.number] = fitting
        sent = _Tally()

        def settle(part: _Part) -> str:
            """The part's ETag for the completion: the stored part's if it holds these bytes, else a new one's."""
            body = _read_span(source, part.offset, part.length, label)
            md5 = hashlib.md5(body, usedforsecurity=False)
            if part.number in claimed:
                kept = next((c for c in claimed[part.number] if c.etag.strip('"') == md5.hexdigest()), None)
                if kept is not None:
                    return kept.etag
                progress.advanced(name, -part.length)
            response = self._upload_request(
                f"uploading part {part.number} of {len(parts)} of {label}", self._client.upload_part,
                Bucket=self.bucket, Key=key, UploadId=upload_id, PartNumber=part.number,
                Body=_metered(body, limiter, progress, name), ContentLength=part.length,
                ContentMD5=base64.b64encode(md5.digest()).decode(),
            )
            sent.add(part.length)
            return str(response["ETag"])

        progress.started(name, size, sum(part.length for part in parts if part.number in claimed))
        try:
            etags = _run_all(settle, parts, threads=UPLOAD_THREADS_PER_BLOB)
            self._upload_request(
                f"finishing the upload of {label}", self._client.complete_multipart_upload, Bucket=self.bucket,
                Key=key, UploadId=upload_id,
                MultipartUpload={"Parts": [{"PartNumber": p.number, "ETag": etags[p]} for p in parts]},
            )
        except _UploadEnded:
            if self.blob_size(digest) != size:
                raise RegistryUnavailableError(
                    f"the multipart upload of {label} was aborted while it ran", where=self.location,
                    hint="`enginesmith gc` with a short --grace removes uploads in progress; run the same command "
                         "again",
                ) from None
        finally:
            progress.finished(name)
        return size - sent.bytes

    def _open_upload(self, key: str, digest: str, label: str) -> tuple[str, dict[int, list[_StoredPart]]]:
        """The newest unfinished upload of ``key`` with its stored parts, or a new upload with none.

        The newest, so that publishers that come later join the same upload, and older ones are left to ``gc``.
        """
        with self._errors(f"looking for an unfinished upload of {label}"):
            pages = self._client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=key)
            uploads = [u for page in pages for u in page.get("Uploads", []) if u["Key"] == key]
        for upload in sorted(uploads, key=lambda u: (u["Initiated"], u["UploadId"]), reverse=True):
            try:
                return upload["UploadId"], self._stored_parts(key, upload["UploadId"], label)
            except _UploadEnded:
                continue  # finished or aborted since the listing
        with self._errors(f"starting the upload of {label}"):
            created = self._client.create_multipart_upload(Bucket=self.bucket, Key=key, Metadata={"sha256": digest})
        return str(created["UploadId"]), {}

    def _stored_parts(self, key: str, upload_id: str, label: str) -> dict[int, list[_StoredPart]]:
        """Part number → the parts stored under it: one on S3, every one sent on SeaweedFS (which completes with
        the one whose ETag the completion names)."""
        stored: dict[int, list[_StoredPart]] = {}
        pages = self._client.get_paginator("list_parts").paginate(Bucket=self.bucket, Key=key, UploadId=upload_id)
        with self._upload_errors(f"listing the uploaded parts of {label}"):
            for page in pages:
                for part in page.get("Parts", []):
                    stored.setdefault(int(part["PartNumber"]), []).append(_StoredPart(
                        size=int(part["Size"]), etag=str(part["ETag"]), modified=part["LastModified"].timestamp()
                    ))
        return stored

    def _upload_request(self, action: str, operation: Callable[..., dict[str, Any]], **params: Any) -> dict[str, Any]:
        with self._upload_errors(action):
            return operation(**params)

    @contextlib.contextmanager
    def _upload_errors(self, action: str) -> Iterator[None]:
        """``_errors``, with an upload that no longer exists raised as ``_UploadEnded``."""
        with self._errors(action):
            try:
                yield
            except self._client.exceptions.ClientError as exc:
                if _error_code(exc) == "NoSuchUpload":
                    raise _UploadEnded from None
                raise

    def read_blob(self, digest: str, offset: int = 0) -> Generator[bytes, None, None]:
        # One stream per blob: with several blobs in flight that beat parallel range requests per blob (fewer
        # requests, fewer copies), measured against boto3's download_file on SeaweedFS. No If-Match on a resumed
        # read: a blob's name is its sha256, and the puller verifies every byte against it.
        action = f"fetching blob sha256:{digest[:12]}"
        with self._errors(action):
            try:
                response = self._client.get_object(
                    Bucket=self.bucket, Key=self._key(blob_path(digest)),
                    **({"Range": f"bytes={offset}-"} if offset else {}),
                )
            except self._client.exceptions.ClientError as exc:
                if _is_missing(exc):
                    raise NotFoundError(
                        f"blob sha256:{digest} is missing from the registry{_request_ids(exc.response)}",
                        where=self.location, hint="re-publish the artefact that lists it",
                    ) from None
                if _error_code(exc) == "InvalidRange":  # a partial file longer than the blob: nothing to add
                    return
                raise
        body = response["Body"]
        try:
            while True:
                with self._errors(action, received=response):
                    chunk = body.read(NETWORK_CHUNK_BYTES)
                if not chunk:
                    return
                yield chunk
        finally:
            body.close()

    def list_blobs(self) -> Generator[BlobInfo, None, None]:
        for item in self._list_objects(self._key("blobs/sha256/")):
            name = item["Key"].rsplit("/", 1)[-1]
            if is_digest(name):
                yield BlobInfo(digest=name, size=int(item["Size"]), modified=item["LastModified"].timestamp())

    def delete_blob(self, digest: str) -> None:
        with self._errors("deleting a blob"):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(blob_path(digest)))

    # --- manifests -----------------------------------------------------------------------------------

    def create_manifest(self, model: str, key: str, body: bytes) -> bool:
        return self._create_once(manifest_path(model, key), body, f"manifest {model}@{key}")

    def _create_once(self, path: str, body: bytes, what: str) -> bool:
        object_key = self._key(path)
        for _ in range(CONDITIONAL_CONFLICT_RETRIES):
            with self._errors(f"writing {what}"):
                try:
                    self._client.put_object(Bucket=self.bucket, Key=object_key, Body=body,
                                            ContentType="application/json", IfNoneMatch="*")
                    return True
                except self._client.exceptions.ClientError as exc:
                    if _error_code(exc) == "PreconditionFailed":
                        return False
                    if _error_code(exc) != "ConditionalRequestConflict":
                        raise
            time.sleep(0.2)  # another writer's conditional PUT is in flight; its outcome decides ours
        if self._get_or_none(object_key, f"reading {what}") is not None:
            return False
        raise RegistryUnavailableError(f"writing {what} kept conflicting with another writer",
                                       where=self.location, hint="run the same command again")

    def read_manifest(self, model: str, key: str) -> bytes | None:
        found = self._get_or_none(self._key(manifest_path(model, key)), f"reading manifest {model}@{key}")
        return None if found is None else found[0]

    def delete_manifest(self, model: str, key: str) -> None:
        with self._errors(f"deleting manifest {model}@{key}"):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(manifest_path(model, key)))

    def list_models(self) -> list[str]:
        return sorted(p for p in self._list_prefixes(self._key("manifests/")) if is_name(p))

    def list_manifest_keys(self, model: str) -> list[str]:
        names = (item["Key"].rsplit("/", 1)[-1] for item in self._list_objects(self._key(manifest_dir(model) + "/")))
        keys = [n.removesuffix(MANIFEST_SUFFIX) for n in names if n.endswith(MANIFEST_SUFFIX)]
        return sorted(k for k in keys if is_name(k))

    # --- stage records -------------------------------------------------------------------------------

    def create_stage(self, stage: str, key: str, body: bytes, files: Sequence[StageFile] = ()) -> bool:
        return self._create_once(stage_path(stage, key), body, f"stage record {stage}/{key}")

    def read_stage(self, stage: str, key: str) -> bytes | None:
        found = self._get_or_none(self._key(stage_path(stage, key)), f"reading stage record {stage}/{key}")
        return None if found is None else found[0]

    def list_stage_keys(self, stage: str) -> list[str]:
        names = (item["Key"].rsplit("/", 1)[-1] for item in self._list_objects(self._key(stage_dir(stage) + "/")))
        keys = [n.removesuffix(MANIFEST_SUFFIX) for n in names if n.endswith(MANIFEST_SUFFIX)]
        return sorted(k for k in keys if is_name(k))

    def delete_stage(self, stage: str, key: str) -> None:
        with self._errors(f"deleting stage record {stage}/{key}"):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(stage_path(stage, key)))

    # --- history records -----------------------------------------------------------------------------

    def create_history(self, model: str, entry: str, body: bytes) -> bool:
        return self._create_once(history_path(model, entry), body, f"history record {model}/{entry}")

    def read_history(self, model: str, entry: str) -> bytes | None:
        found = self._get_or_none(self._key(history_path(model, entry)), f"reading history record {model}/{entry}")
        return None if found is None else found[0]

    def list_history(self, model: str) -> list[str]:
        names = (item["Key"].rsplit("/", 1)[-1] for item in self._list_objects(self._key(history_dir(model) + "/")))
        entries = [n.removesuffix(MANIFEST_SUFFIX) for n in names if n.endswith(MANIFEST_SUFFIX)]
        return sorted(e for e in entries if is_name(e))

    # --- refs ----------------------------------------------------------------------------------------

    def read_ref(self, model: str, channel: str) -> RefState | None:
        found = self._get_or_none(self._key(ref_path(model, channel)), f"reading ref {model}:{channel}")
        if found is None:
            return None
        body, etag = found
        try:
            record = json.loads(body)
            return RefState(key=str(record["key"]), version=etag, updated=str(record.get("updated", "")))
        except (ValueError, KeyError, TypeError):
            from registry.errors import IntegrityError

            raise IntegrityError("ref object is damaged", where=f"{self.location}/{ref_path(model, channel)}",
                                 hint="delete the object, then point the channel again with `enginesmith promote`"
                                 ) from None

    def write_ref(self, model: str, channel: str, key: str, expected: RefState | None) -> bool:
        body = json.dumps({"key": key, "updated": utc_timestamp()}).encode() + b"\n"
        condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected.version}
        with self._errors(f"moving ref {model}:{channel}"):
            try:
                self._client.put_object(Bucket=self.bucket, Key=self._key(ref_path(model, channel)), Body=body,
                                        ContentType="application/json", **condition)
            except self._client.exceptions.ClientError as exc:
                if _error_code(exc) in ("PreconditionFailed", "ConditionalRequestConflict"):
                    return False
                raise
        return True

    def list_channels(self, model: str) -> list[str]:
        names = (item["Key"].rsplit("/", 1)[-1] for item in self._list_objects(self._key(refs_dir(model) + "/")))
        return sorted(n for n in names if is_name(n))

    # --- housekeeping --------------------------------------------------------------------------------

    def delete_stale_uploads(self, older_than_s: float, *, now: float | None = None) -> int:
        # Idle, not merely old: a publish of a big blob may run for longer than the grace period, and each part it
        # stores shows that it is alive.
        cutoff = (time.time() if now is None else now) - older_than_s
        aborted = 0
        with self._errors("listing unfinished uploads"):
            pages = self._client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket,
                                                                                   Prefix=self._key(""))
            uploads = [upload for page in pages for upload in page.get("Uploads", [])]
        for upload in uploads:
            if upload["Initiated"].timestamp() >= cutoff:
                continue
            try:
                parts = self._stored_parts(upload["Key"], upload["UploadId"], upload["Key"])
                if any(part.modified >= cutoff for candidates in parts.values() for part in candidates):
                    continue
                self._upload_request(f"aborting the unfinished upload of {upload['Key']}",
                                     self._client.abort_multipart_upload, Bucket=self.bucket, Key=upload["Key"],
                                     UploadId=upload["UploadId"])
            except _UploadEnded:
                continue  # finished or aborted by someone else meanwhile
            aborted += 1
        return aborted

    def require_exists(self, where: str) -> None:
        with self._errors("looking for the registry"):
            found = self._client.list_objects_v2(Bucket=self.bucket, Prefix=self._key(""), MaxKeys=1)
        if not found.get("Contents"):
            raise NotFoundError(
                f"no registry at {self.location}: no object is stored under that prefix", where=where,
                hint="check the bucket and prefix; an S3 registry is there once anything is stored under its prefix "
                     "(blobs/, manifests/, refs/, history/), as `enginesmith publish` and `enginesmith copy` do")

    # --- plumbing ------------------------------------------------------------------------------------

    def _key(self, path: str) -> str:
        return f"{self.prefix}/{path}" if self.prefix else path

    @property
    def _client(self) -> Any:
        with self._client_lock:  # worker threads may be the first to ask; boto3 clients are shareable, not free
            if self._client_instance is None:
                self._client_instance = self._make_client()
        return self._client_instance

    def _make_client(self) -> Any:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise UserError(f"{self.location} is an S3 registry, and boto3 is not installed here", where="--registry",
                            hint="pip install 'enginesmith[s3]'") from None

        session = boto3.session.Session()
        credentials = session.get_credentials()
        if credentials is None:
            raise UserError(f"no AWS credentials found for {self.location}", where="--registry",
                            hint=_CREDENTIALS_HINT)
        frozen = credentials.get_frozen_credentials()
        register_secret(frozen.secret_key)
        register_secret(frozen.token)
        config = Config(
            retries={"mode": "standard", "max_attempts": REQUEST_ATTEMPTS},
            connect_timeout=5,
            read_timeout=60,
            max_pool_connections=32,
            # Our own sha256 verifies every byte; boto3's default CRCs would only add a second pass.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            s3={"addressing_style": "path"} if self.endpoint_url else None,
        )
        client = session.client("s3", endpoint_url=self.endpoint_url, config=config,
                                region_name=session.region_name or "us-east-1")
        # A body counts towards the rate limit and progress only while it is sent: signing a request over plain
        # HTTP reads the body once before that. These are the handlers s3transfer registers for the same reason.
        from s3transfer.utils import signal_not_transferring, signal_transferring

        client.meta.events.register_first("request-created.s3", signal_not_transferring,
                                          unique_id="s3upload-not-transferring")
        client.meta.events.register_last("request-created.s3", signal_transferring, unique_id="s3upload-transferring")
        return client

    def _get_or_none(self, object_key: str, action: str) -> tuple[bytes, str] | None:
        with self._errors(action):
            try:
                response = self._client.get_object(Bucket=self.bucket, Key=object_key)
            except self._client.exceptions.ClientError as exc:
                if _is_missing(exc):
                    return None
                raise
            return response["Body"].read(), str(response["ETag"])

    def _list_objects(self, prefix: str) -> Iterator[dict[str, Any]]:
        with self._errors(f"listing {prefix or '/'}"):
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                yield from page.get("Contents", [])

    def _list_prefixes(self, prefix: str) -> list[str]:
        names: list[str] = []
        with self._errors(f"listing {prefix or '/'}"):
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix,
                                                                            Delimiter="/")
            for page in pages:
                names += [p["Prefix"][len(prefix):].strip("/") for p in page.get("CommonPrefixes", [])]
        return names

    @contextlib.contextmanager
    def _errors(self, action: str, *, received: Mapping[str, Any] | None = None) -> Iterator[None]:
        """Turn boto3's exceptions into errors that say what failed and what to do, with secrets scrubbed.

        Each names the server's request id (and host id) where there was a response: a storage team asks for them
        first. ``received`` is the response whose body is being read, for failures part-way through it.
        """
        import botocore.exceptions as boto_errors
        import urllib3.exceptions

        unavailable = (boto_errors.EndpointConnectionError, boto_errors.ConnectionError, boto_errors.HTTPClientError,
                       boto_errors.ReadTimeoutError, boto_errors.ConnectTimeoutError, boto_errors.IncompleteReadError,
                       boto_errors.ResponseStreamingError, urllib3.exceptions.HTTPError, ConnectionError, TimeoutError)
        try:
            yield
        except boto_errors.NoCredentialsError:
            raise UserError(f"no AWS credentials found for {self.location}", where="--registry",
                            hint=_CREDENTIALS_HINT) from None
        except boto_errors.ClientError as exc:
            code, status, ids = _error_code(exc), _status(exc), _request_ids(exc.response)
            if code == "NoSuchBucket":
                raise UserError(f"bucket {self.bucket!r} does not exist{ids}", where=self.location,
                                hint="create the bucket, or check --registry and --s3-endpoint") from None
            if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise UserError(scrub(f"access denied ({code}) while {action}{ids}"), where=self.location,
                                hint=_CREDENTIALS_HINT) from None
            if status is not None and status >= 500:
                raise RegistryUnavailableError(scrub(f"server error {status} ({code}) while {action}{ids}"),
                                               where=self.location, hint="try again later") from None
            raise UserError(scrub(f"{code} while {action}: {exc}{ids}"), where=self.location) from None
        except unavailable as exc:
            ids = _request_ids(received) if received is not None else ""
            raise RegistryUnavailableError(
                scrub(f"the storage stopped answering while {action} ({type(exc).__name__}){ids}"),
                where=self.location,
                hint="check that the server is up; run the same command again and it resumes where it stopped",
            ) from None


@dataclass(frozen=True)
class _Part:
    number: int  # from 1, as S3 counts
    offset: int
    length: int


@dataclass(frozen=True)
class _StoredPart:
    size: int
    etag: str  # as the server wrote it, quotes included: the completion must repeat it
    modified: float  # seconds since the epoch


class _UploadEnded(Exception):
    """The multipart upload is gone: completed by another publisher, or aborted."""


class _Tally:
    """Bytes counted from several threads."""

    def __init__(self) -> None:
        self.bytes = 0
        self._lock = threading.Lock()

    def add(self, count: int) -> None:
        with self._lock:
            self.bytes += count


def _split(size: int, part_bytes: int) -> list[_Part]:
    return [_Part(number=index + 1, offset=offset, length=min(part_bytes, size - offset))
            for index, offset in enumerate(range(0, size, part_bytes))]


def _read_span(source: Path, offset: int, length: int, label: str) -> bytes:
    with source.open("rb") as handle:
        handle.seek(offset)
        body = handle.read(length)
    if len(body) != length:
        raise IntegrityError(f"{label} now ends at byte {offset + len(body)}; it had at least {offset + length}",
                             where=str(source),
                             hint="the file changed while it was being published; rebuild the artefact")
    return body


def _content_md5(body: bytes) -> str:
    """The Content-MD5 header: the server refuses a body that arrives different (BadDigest)."""
    return base64.b64encode(hashlib.md5(body, usedforsecurity=False).digest()).decode()


def _metered(body: bytes, limiter: RateLimiter | None, progress: TransferProgress, name: str) -> Any:
    """``body`` as a request body that passes the rate limit and reports progress as it is sent (a retry rewinds
    it, reporting the bytes sent again as negative progress)."""
    from s3transfer.utils import ReadFileChunk

    def sent(bytes_transferred: int) -> None:
        if limiter is not None and bytes_transferred > 0:
            limiter.consume(bytes_transferred)
        progress.advanced(name, bytes_transferred)

    return ReadFileChunk(io.BytesIO(body), len(body), len(body), callbacks=[sent], enable_callbacks=False)


def _run_all(work: Callable[[_Part], str], parts: list[_Part], *, threads: int) -> dict[_Part, str]:
    """``work`` on every part, ``threads`` at a time; the first failure cancels the parts not yet started."""
    results: dict[_Part, str] = {}
    with ThreadPoolExecutor(threads, thread_name_prefix="upload-part") as pool:
        futures: dict[Future[str], _Part] = {pool.submit(work, part): part for part in parts}
        try:
            for future in as_completed(futures):
                results[futures[future]] = future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return results


def _request_ids(response: Mapping[str, Any]) -> str:
    """`` (S3 request id …, host id …)`` from a response's metadata, or nothing where it has neither."""
    metadata = response.get("ResponseMetadata", {})
    ids = [f"{label} {metadata[field]}" for field, label in (("RequestId", "S3 request id"), ("HostId", "host id"))
           if metadata.get(field)]
    return f" ({', '.join(ids)})" if ids else ""

def _error_code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: Any) -> int | None:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _is_missing(exc: Any) -> bool:
    return _error_code(exc) in ("NoSuchKey", "404", "NotFound") or (
        _status(exc) == 404 and _error_code(exc) != "NoSuchBucket"
    )
