"""The S3-compatible backend (boto3, imported here only).

The commit points are S3's conditional writes: a manifest is created with ``If-None-Match: *`` (so it is
exclusive, and S3 objects are never visible half-written), a ref is moved with ``If-Match: <etag>``.
Credentials come from boto3's usual chain (environment, ``~/.aws`` files, instance roles); the secret parts
are registered with ``enginesmith.secrets`` as they are read, so no message or log record can show them.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

from enginesmith.errors import UserError
from enginesmith.secrets import register_secret, scrub
from registry.errors import NotFoundError, RegistryUnavailableError
from registry.manifest import utc_timestamp
from registry.names import (
    MANIFEST_SUFFIX,
    blob_path,
    is_digest,
    is_name,
    manifest_dir,
    manifest_path,
    ref_path,
    refs_dir,
)
from registry.store import BlobInfo, RefState
from registry.transfer import NETWORK_CHUNK_BYTES, RateLimiter, TransferProgress

# Parts small enough that a retried part costs little and a loaded server is not handed jobs × threads × part
# bytes at once (s3transfer raises the part size itself where 10,000 parts would not hold a blob).
MULTIPART_PART_BYTES = 16 * 1024 * 1024
UPLOAD_THREADS_PER_BLOB = 2
REQUEST_ATTEMPTS = 4
CONDITIONAL_CONFLICT_RETRIES = 5
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_CREDENTIALS_HINT = ("check the AWS credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, "
                     "or ~/.aws/credentials")


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
    def from_url(cls, url: str, *, endpoint_url: str | None = None) -> S3Store:
        """``s3://bucket[/prefix]`` → store; raises ``UserError`` for a malformed URL."""
        if "@" in url:
            raise UserError("the registry URL must not carry credentials", where="--registry",
                            hint="give them through the AWS environment variables or ~/.aws/credentials")
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not _BUCKET.match(bucket):
            raise UserError(f"{bucket!r} is not an S3 bucket name", where="--registry",
                            hint="write s3://BUCKET/PREFIX, e.g. s3://engines/prod")
        return cls(bucket, prefix, endpoint_url=endpoint_url)

    @property
    def location(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        return f"{where} at {self.endpoint_url}" if self.endpoint_url else where

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
                 progress: TransferProgress | None = None, name: str = "") -> None:
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(multipart_threshold=self.multipart_part_bytes,
                                multipart_chunksize=self.multipart_part_bytes, max_concurrency=UPLOAD_THREADS_PER_BLOB)

        def sent(bytes_count: int) -> None:
            # s3transfer calls this from the thread that reads the file, so sleeping here throttles the upload;
            # a retried part reports negative counts.
            if limiter is not None and bytes_count > 0:
                limiter.consume(bytes_count)
            if progress is not None:
                progress.advanced(name, bytes_count)

        with self._errors(f"uploading {name or source}"):
            self._client.upload_file(str(source), self.bucket, self._key(blob_path(digest)),
                                     ExtraArgs={"Metadata": {"sha256": digest}}, Config=config, Callback=sent)

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
                    raise NotFoundError(f"blob sha256:{digest} is missing from the registry", where=self.location,
                                        hint="re-publish the artefact that lists it") from None
                if _error_code(exc) == "InvalidRange":  # a partial file longer than the blob: nothing to add
                    return
                raise
        body = response["Body"]
        try:
            while True:
                with self._errors(action):
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
        object_key = self._key(manifest_path(model, key))
        for _ in range(CONDITIONAL_CONFLICT_RETRIES):
            with self._errors(f"writing manifest {model}@{key}"):
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
        if self.read_manifest(model, key) is not None:
            return False
        raise RegistryUnavailableError(f"writing manifest {model}@{key} kept conflicting with another writer",
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

    def delete_stale_uploads(self, older_than_s: float) -> int:
        cutoff = time.time() - older_than_s
        aborted = 0
        with self._errors("listing unfinished uploads"):
            paginator = self._client.get_paginator("list_multipart_uploads")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key("")):
                for upload in page.get("Uploads", []):
                    if upload["Initiated"].timestamp() < cutoff:
                        self._client.abort_multipart_upload(Bucket=self.bucket, Key=upload["Key"],
                                                            UploadId=upload["UploadId"])
                        aborted += 1
        return aborted

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
        import boto3
        from botocore.config import Config

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
        return session.client("s3", endpoint_url=self.endpoint_url, config=config,
                              region_name=session.region_name or "us-east-1")

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
    def _errors(self, action: str) -> Iterator[None]:
        """Turn boto3's exceptions into errors that say what failed and what to do, with secrets scrubbed."""
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
            code, status = _error_code(exc), _status(exc)
            if code == "NoSuchBucket":
                raise UserError(f"bucket {self.bucket!r} does not exist", where=self.location,
                                hint="create the bucket, or check --registry and --s3-endpoint") from None
            if status == 403 or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                raise UserError(scrub(f"access denied ({code}) while {action}"), where=self.location,
                                hint=_CREDENTIALS_HINT) from None
            if status is not None and status >= 500:
                raise RegistryUnavailableError(scrub(f"server error {status} ({code}) while {action}"),
                                               where=self.location, hint="try again later") from None
            raise UserError(scrub(f"{code} while {action}: {exc}"), where=self.location) from None
        except unavailable as exc:
            raise RegistryUnavailableError(
                scrub(f"the storage stopped answering while {action} ({type(exc).__name__})"), where=self.location,
                hint="check that the server is up; run the same command again and it resumes where it stopped",
            ) from None


def _error_code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: Any) -> int | None:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if status is not None else None


def _is_missing(exc: Any) -> bool:
    return _error_code(exc) in ("NoSuchKey", "404", "NotFound") or (
        _status(exc) == 404 and _error_code(exc) != "NoSuchBucket"
    )
