"""TEST DOUBLE for the network: an HTTP proxy on loopback in front of a real S3 server (SeaweedFS) or OCI registry
(docker-registry) that cuts the connection after a set number of bytes of a blob's body, the way a reset connection
or a load balancer's idle cut ends a download mid-stream.

Requests are forwarded byte for byte (headers included, so the client's SigV4 signature still holds for the
server). For ``GET`` of the blob ``cut_digest``, the first ``cuts`` responses send ``cut_after_bytes`` of the body
and then close the connection; every body byte forwarded is counted per blob, with the ``Range`` header each
request asked for, so a test can tell whether a byte crossed the network twice.

With ``refuse_mounts`` it plays an OCI registry that cannot mount a blob across repositories: a ``POST
…/blobs/uploads/?mount=…&from=…`` reaches the server without its query, so the server opens an upload session, as
such a registry answers. With ``head_without_digest``, a ``HEAD`` answer loses its ``Docker-Content-Digest``
header (a SHOULD of the spec that some registries skip). With ``failing_upload_status``, that many ``GET``s of an
upload session's status are answered 503 without reaching the server (a load balancer's hiccup). The body size of
every ``PATCH`` is recorded (``patches``: path, bytes).
"""

from __future__ import annotations

import http.client
import re
import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

FORWARD_CHUNK_BYTES = 64 * 1024
_BLOB_PATH = re.compile(r"/blobs/sha256[/:]([0-9a-f]{64})$")
_UPLOAD_PATH = re.compile(r"/blobs/uploads/[^/]+$")
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}


class CuttingProxy:
    def __init__(self, upstream: str, *, cut_digest: str = "", cut_after_bytes: int = 0, cuts: int = 0,
                 refuse_mounts: bool = False, head_without_digest: bool = False,
                 failing_upload_status: int = 0) -> None:
        parts = urlsplit(upstream)
        self.upstream_host, self.upstream_port = parts.hostname or "127.0.0.1", parts.port or 80
        self.cut_digest = cut_digest
        self.cut_after_bytes = cut_after_bytes
        self.cuts_left = cuts
        self.body_bytes: dict[str, int] = defaultdict(int)  # digest → body bytes forwarded
        self.ranges: dict[str, list[str]] = defaultdict(list)  # digest → Range header of each GET ("" for none)
        self.refuse_mounts = refuse_mounts
        self.head_without_digest = head_without_digest
        self.mounts_refused = 0
        self.upload_status_left_to_fail = failing_upload_status
        self.patches: list[tuple[str, int]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _take_cut(self) -> bool:
        with self._lock:
            if self.cuts_left <= 0:
                return False
            self.cuts_left -= 1
            return True

    def _count(self, digest: str, body_bytes: int) -> None:
        with self._lock:
            self.body_bytes[digest] += body_bytes

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                path = self.path
                with proxy._lock:
                    failing = self.command == "GET" and _UPLOAD_PATH.search(path.split("?", 1)[0]) is not None \
                        and proxy.upload_status_left_to_fail > 0
                    if failing:
                        proxy.upload_status_left_to_fail -= 1
                    if self.command == "PATCH":
                        proxy.patches.append((path.split("?", 1)[0], length))
                    if proxy.refuse_mounts and self.command == "POST" and "mount=" in path:
                        path = path.split("?", 1)[0]
                        proxy.mounts_refused += 1
                if failing:
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
                upstream.putrequest(self.command, path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in _HOP_BY_HOP:
                        upstream.putheader(name, value)
                upstream.endheaders(body)
                response = upstream.getresponse()
                blob = _BLOB_PATH.search(self.path.split("?", 1)[0])  # S3's blobs/sha256/<hex>, OCI's sha256:<hex>
                digest = blob.group(1) if blob and self.command == "GET" else None
                cut = digest == proxy.cut_digest and response.status in (200, 206) and proxy._take_cut()
                if digest is not None:
                    with proxy._lock:
                        proxy.ranges[digest].append(self.headers.get("Range", ""))
                self.send_response_only(response.status, response.reason)
                for name, value in response.getheaders():
                    dropped = proxy.head_without_digest and self.command == "HEAD" and \
                        name.lower() == "docker-content-digest"
                    if name.lower() not in _HOP_BY_HOP and not dropped:
                        self.send_header(name, value)
                self.end_headers()
                sent = 0
                while True:
                    want = FORWARD_CHUNK_BYTES if not cut else min(FORWARD_CHUNK_BYTES, proxy.cut_after_bytes - sent)
                    chunk = response.read(want) if want > 0 else b""
                    if not chunk:
                        break
                    self.wfile.write(chunk)
                    sent += len(chunk)
                    if digest is not None:
                        proxy._count(digest, len(chunk))
                upstream.close()
                if cut:
                    self.wfile.flush()
                    self.close_connection = True  # the client sees the body end short of its Content-Length

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _forward

        return Handler

    @contextmanager
    def running(self) -> Iterator[CuttingProxy]:
        thread = threading.Thread(target=self._server.serve_forever, name="cutting-proxy", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=10)
