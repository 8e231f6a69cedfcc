"""TEST DOUBLE: a minimal Hugging Face Hub on loopback, at the one boundary we cannot cross here (no Hub access).

It serves the routes huggingface_hub's ``model_info``, ``hf_hub_download`` and ``snapshot_download`` use
(``/api/models/<repo>/revision/<rev>``, ``/api/models/<repo>/tree/<rev>`` (the listing huggingface_hub 2.x's
``snapshot_download`` reads) and ``/<repo>/resolve/<rev>/<file>`` with HEAD, GET and Range), the
Hub's error headers (``X-Error-Code``), and two faults on demand: a download cut off half-way, and a 401
whose body echoes the caller's Authorization header (as a misbehaving proxy might) to test secret scrubbing.
The client side is the real huggingface_hub.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".bin")


@dataclass
class FakeRepo:
    commits: dict[str, Path]  # commit sha -> directory of files
    branches: dict[str, str]  # branch or tag -> commit sha
    echo_authorization: bool = False


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    cut_off_once: set[str] = field(default_factory=set)  # file names whose next GET stops half-way
    requests: list[str] = field(default_factory=list)
    outage_status: int | None = None  # answer every request with this status (a Hub outage: 503, 429, ...)

    def add_repo(self, repo_id: str, files_dir: Path, *, branch: str = "main", commit_sha: str | None = None,
                 echo_authorization: bool = False) -> str:
        sha = commit_sha or hashlib.sha1(f"{repo_id}:{files_dir}".encode(), usedforsecurity=False).hexdigest()
        repo = self.repos.setdefault(repo_id, FakeRepo(commits={}, branches={}, echo_authorization=echo_authorization))
        repo.commits[sha] = files_dir
        repo.branches[branch] = sha
        return sha

    def resolve(self, repo_id: str, revision: str) -> tuple[FakeRepo | None, str | None]:
        repo = self.repos.get(repo_id)
        if repo is None:
            return None, None
        sha = repo.branches.get(revision, revision if revision in repo.commits else None)
        return repo, sha


def _blob_sha1(data: bytes) -> str:
    """Git's blob id: what the Hub names a file by in the tree listing (and, for a non-LFS file, in its ETag)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _tree_entry(path: Path, root: Path) -> dict[str, object]:
    data = path.read_bytes()
    entry: dict[str, object] = {"type": "file", "path": str(path.relative_to(root)), "size": len(data),
                                "oid": _blob_sha1(data)}
    if path.suffix in LFS_SUFFIXES:
        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return entry


def _file_meta(path: Path) -> dict[str, object]:
    data = path.read_bytes()
    meta: dict[str, object] = {"size": len(data)}
    if path.suffix in LFS_SUFFIXES:
        meta["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
    return meta


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub

    def log_message(self, format: str, *args: object) -> None:  # keep test output quiet
        pass

    def _error(self, status: int, code: str, message: str, body: str | None = None) -> None:
        payload = (body or json.dumps({"error": message})).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _lookup(self, repo_id: str, revision: str) -> tuple[FakeRepo, str] | None:
        repo, sha = self.hub.resolve(repo_id, revision)
        if repo is not None and repo.echo_authorization:
            self._error(401, "", "Invalid credentials", body=f"bad token: {self.headers.get('Authorization')}")
            return None
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found")
            return None
        if sha is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return repo, sha

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def _serve(self, send_body: bool) -> None:
        self.hub.requests.append(f"{self.command} {self.path}")
        if self.hub.outage_status is not None:
            self._error(self.hub.outage_status, "", "Service Unavailable")
            return
        path = self.path.split("?")[0]
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/(.+)", path):
            self._model_info(match.group(1), match.group(2).replace("%2F", "/"))
        elif match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path):
            self._tree(match.group(1), match.group(2).replace("%2F", "/"))
        elif match := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            self._resolve(match.group(1), match.group(2).replace("%2F", "/"), match.group(3), send_body)
        else:
            self._error(404, "EntryNotFound", "no such route")

    def _model_info(self, repo_id: str, revision: str) -> None:
        found = self._lookup(repo_id, revision)
        if found is None:
            return
        repo, sha = found
        root = repo.commits[sha]
        siblings = [{"rfilename": str(p.relative_to(root)), **_file_meta(p)}
                    for p in sorted(root.rglob("*")) if p.is_file()]
        self._json({"id": repo_id, "modelId": repo_id, "sha": sha, "private": False, "siblings": siblings})

    def _tree(self, repo_id: str, revision: str) -> None:
        found = self._lookup(repo_id, revision)
        if found is None:
            return
        repo, sha = found
        root = repo.commits[sha]
        self._json([_tree_entry(p, root) for p in sorted(root.rglob("*")) if p.is_file()])

    def _json(self, body: object) -> None:
        payload = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _resolve(self, repo_id: str, revision: str, filename: str, send_body: bool) -> None:
        found = self._lookup(repo_id, revision)
        if found is None:
            return
        repo, sha = found
        path = repo.commits[sha] / filename
        if not path.is_file():
            self._error(404, "EntryNotFound", f"{filename} not found")
            return
        data = path.read_bytes()
        etag = hashlib.sha256(data).hexdigest() if path.suffix in LFS_SUFFIXES else _blob_sha1(data)
        start = 0
        if match := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", "")):
            start = int(match.group(1))
        body = data[start:]
        self.send_response(206 if start else 200)
        self.send_header("X-Repo-Commit", sha)
        self.send_header("ETag", f'"{etag}"')
        self.send_header("Content-Length", str(len(body)))
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not send_body:
            return
        if filename in self.hub.cut_off_once:
            self.hub.cut_off_once.discard(filename)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(body)


class FakeHubServer:
    """Run a FakeHub on 127.0.0.1 in a thread; ``endpoint`` is what HF_ENDPOINT should be."""

    def __init__(self, hub: FakeHub) -> None:
        handler = type("Handler", (_Handler,), {"hub": hub})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> FakeHubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
