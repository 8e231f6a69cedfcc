"""An OpenAI-compatible server as a managed process: started on a free loopback port, healthy within a
timeout (while we watch that it is alive), logged to a file, and always stopped — the whole process group,
also on Ctrl-C and on errors. An already-running endpoint (a URL) is accepted in its place."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from enginesmith.core.errors import TransientError, UserError
from enginesmith.core.process import spawn, stop_group

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Endpoint:
    base_url: str  # http://host:port (no /v1)
    model: str
    log_path: Path | None = None
    pid: int | None = None  # the server process we started, if we did


def server_reason(response: httpx.Response) -> str:
    """What the server said about a refused request: the message of its OpenAI-style error body (vLLM's
    ``{"object": "error", "message": ...}`` or ``{"error": {"message": ...}}``), else the start of its body."""
    try:
        body = response.json()
    except ValueError:
        return response.text[:500].strip() or response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    message = (error.get("message") if isinstance(error, dict) else None) or (
        body.get("message") if isinstance(body, dict) else None)
    return str(message)[:1000] if message else response.text[:500]


def check_answer(response: httpx.Response, *, what: str) -> None:
    """A request the server refused, as an error carrying the server's own reason: 4xx is the request's or the
    model's fault (a UserError, never retried as it is), 5xx a TransientError."""
    if response.is_success:
        return
    url = response.request.url
    message = f"{what}: {url.path} on {url.host}:{url.port} answered {response.status_code}: {server_reason(response)}"
    if response.status_code >= 500:
        raise TransientError(message, where=str(url), hint="the server's log says more")
    raise UserError(message, where=str(url), hint="the server refused the request itself; its reason is above")


def _process_gone(pid: int) -> bool:
    """Has our server process exited (a zombie not yet reaped counts as exited)? Read from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return Path("/proc/self").exists()  # no such process, where /proc can tell
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def check_still_serving(endpoint: Endpoint, *, name: str, during: str) -> None:
    """A server that died mid-validation (its process gone, or its engine dead: ``/health`` no longer 200) stops the
    cell at once, as a runtime failure carrying its log's tail, not as failed requests a gate would judge. It is a
    TransientError: the artefact was not shown to be at fault, and the flows retry the cell."""
    gone = endpoint.pid is not None and _process_gone(endpoint.pid)
    health = ""
    if not gone:
        try:
            status = httpx.get(f"{endpoint.base_url}/health", timeout=10).status_code
        except httpx.HTTPError as exc:
            health = type(exc).__name__
        else:
            if status < 500:  # 200; or 404 from a server without /health, which still serves
                return
            health = str(status)
    what = "its process exited" if gone else f"/health answered {health}"
    tail = f"\n--- last lines of {endpoint.log_path} ---\n{_log_tail(endpoint.log_path)}" if endpoint.log_path \
        else ""
    raise TransientError(f"the {name} server died during {during} ({what}): stopped measuring; nothing was judged"
                         f"{tail}", where=str(endpoint.log_path or endpoint.base_url),
                         hint="a runtime failure, not a verdict on the artefact: the flows retry the cell; the log "
                              "says why the server died (out of memory, an engine error)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def served_model_name(base_url: str, timeout_s: float = 10) -> str:
    """The first model id ``/v1/models`` lists."""
    response = httpx.get(f"{base_url}/v1/models", timeout=timeout_s)
    check_answer(response, what="listing the served models")
    return str(response.json()["data"][0]["id"])


def _log_tail(log_path: Path, lines: int = 25) -> str:
    if not log_path.is_file():
        return "(no log)"
    return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def running_server(argv: Sequence[str], env: dict[str, str], *, port: int, log_path: Path, name: str,
                   health_timeout_s: float = 600, model_name: str | None = None) -> Iterator[Endpoint]:
    """Start ``argv`` (already rendered for ``port``), wait for ``/health`` and ``/v1/models`` (or take
    ``model_name`` as given), yield the endpoint, and stop the process group on the way out. A server that dies
    or never gets healthy raises a UserError with the last lines of its log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    base_url = f"http://{LOOPBACK}:{port}"
    with log_path.open("w") as log:
        process = spawn(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env},
                        start_new_session=True)
        try:
            model = _wait_healthy(process, base_url, log_path, name, health_timeout_s, model_name)
            yield Endpoint(base_url=base_url, model=model, log_path=log_path, pid=process.pid)
        finally:
            stop_group(process)


# A server that exits before it is healthy has usually refused its own inputs (a flag, the artefact, the memory it
# was given): retrying cannot help. What can: another process holding the port.
_RETRYABLE_EXITS = ("address already in use",)  # lower case, as matched
_REJECTED_FLAG = ("unrecognized arguments", "error: argument", "invalid choice")
_OUT_OF_MEMORY = ("out of memory", "outofmemoryerror", "cannot allocate memory")
SIGKILL_STATUS = -9


def exit_error(name: str, status: int, log_path: Path) -> UserError:
    """Why a server exited before it was healthy: a ``TransientError`` only for a cause outside the artefact (the
    port taken); a rejected flag, out of memory or any other exit of its own is deterministic."""
    tail = _log_tail(log_path)
    lowered = tail.lower()
    where, shown = str(log_path), f"\n--- last lines of {log_path} ---\n{tail}"
    if any(marker in lowered for marker in _RETRYABLE_EXITS):
        return TransientError(f"the {name} server could not bind its port (status {status}){shown}", where=where,
                              hint="another process took the port; the flows retry with a new one")
    if any(marker in lowered for marker in _REJECTED_FLAG):
        return UserError(f"the {name} server rejected its arguments (status {status}){shown}", where=where,
                         hint="a flag this runtime version does not take: check the serve recipe against the "
                              "installed runtime (enginesmith serve --print shows the command)")
    if status == SIGKILL_STATUS or any(marker in lowered for marker in _OUT_OF_MEMORY):
        cause = "was killed by SIGKILL (most often the kernel's out-of-memory killer)" if status == SIGKILL_STATUS \
            else "ran out of memory"
        return UserError(f"the {name} server {cause} before it was healthy (status {status}){shown}", where=where,
                         hint="give it a larger device or fewer sequences (max_batch_size, max_seq_len), or a "
                              "smaller recipe")
    return UserError(f"the {name} server exited with status {status} before it was healthy{shown}", where=where,
                     hint="read the log for its error; a retry would end the same way")


def _wait_healthy(process: subprocess.Popen[bytes], base_url: str, log_path: Path, name: str,
                  timeout_s: float, model_name: str | None = None) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise exit_error(name, process.returncode, log_path)
        try:
            if httpx.get(f"{base_url}/health", timeout=2).status_code == 200:
                return model_name or served_model_name(base_url)
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TransientError(f"the {name} server was not healthy within {timeout_s:.0f} s\n"
                    f"--- last lines of {log_path} ---\n{_log_tail(log_path)}", where=str(log_path),
                    hint="raise the health timeout, or read the log for why it is stuck")


def external_endpoint(url: str) -> Endpoint:
    """An already-running server given by URL (with or without a trailing /v1)."""
    base_url = url.rstrip("/").removesuffix("/v1")
    try:
        return Endpoint(base_url=base_url, model=served_model_name(base_url))
    except (httpx.HTTPError, KeyError, IndexError) as exc:
        raise UserError(f"no OpenAI-compatible server answers at {url}: {exc}", where=url,
                        hint="check the URL; /v1/models must list the model") from None
